"""Stage 7: the paged KV cache: this request's block table drawn large (table_html:
its blocks, their slots filling token by token, the shared and cached ones, and after the
finish what was freed and what stays in the prefix cache), the block pool as a small overview
grid (other requests' blocks, freed blocks); and the cache-size formula with the served
model's numbers.

The pool is drawn from the engine's `kv.pool` events (each says what changed in the pool
after a step; see engine/trace/kv_pool.py), folded in order by apply_kv_pool into one
dict: {"step", "num_blocks", "block_size", "ref": [..], "cached": [..],
"owners": {block: [request ids]}, "fill": {block: tokens}} (owners and fill: held blocks only)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from visualizers._html import empty, esc, hover_attr, hover_img, panel, said_html, said_html_n
from visualizers.i18n import N_, gettext, number, size
from visualizers.kv_latent import latent_formula_html
from visualizers.kv_table import finish_words, table_html
from visualizers.selection import Selection, header_html


def empty_pool(num_blocks: int, block_size: int, step: int = 0) -> dict:
    return {"step": step, "num_blocks": num_blocks, "block_size": block_size, "ref": [0] * num_blocks,
            "cached": [False] * num_blocks, "owners": {}, "fill": {}}


def copy_pool(pool: dict) -> dict:
    return {**pool, "ref": list(pool["ref"]), "cached": list(pool["cached"]), "owners": dict(pool["owners"]),
            "fill": dict(pool["fill"])}


def apply_kv_pool(pool: dict | None, event: dict) -> dict:
    """The pool after one kv.pool event, folded into `pool` in place (a full event, or a pool
    of another shape, starts from an empty one: a full event lists every block in use)."""
    n = event["num_blocks"]
    if pool is None or event["full"] or pool["num_blocks"] != n:
        pool = empty_pool(n, event["block_size"])
    ref, cached, owners, fill = pool["ref"], pool["cached"], pool["owners"], pool["fill"]
    for b, own, r, f, c in zip(event["blocks"], event["owners"], event["ref"], event["fill"], event["cached"]):
        ref[b], cached[b] = r, c
        if own:
            owners[b], fill[b] = own, f
        else:
            owners.pop(b, None)
            fill.pop(b, None)
    pool["step"] = event["step"]
    return pool


def pool_at(events: Sequence[dict], step: int | None = None) -> dict | None:
    """The pool after `step` (None: the last) from a trace's kv.pool events; None before the first."""
    pool = None
    for e in events:
        if e["type"] == "kv.pool" and (step is None or e["step"] <= step):
            pool = apply_kv_pool(pool, e)
    return pool


DECODE_POOL = "kv.decode_pool"  # disaggregated: a decode engine's kv.pool after the first (engine_index > 0)


def pool_engine(event: dict) -> int | None:
    """Which decode engine's pool a pool event folds into (0: the one engine, or decode 0);
    None: not a pool event of a decode engine."""
    if event["type"] == "kv.pool":
        return 0
    return int(event.get("engine_index", 0)) if event["type"] == DECODE_POOL else None


def decode_engine_of(events: Sequence[dict]) -> int:
    """The decode engine that holds a request's KV pages: the kv.transfer's dst ("decode j"),
    else the engine_index of its decode-side kv.* events; 0 with one engine."""
    for e in events:
        if e["type"] == "kv.transfer" and str(e.get("dst", "")).startswith("decode "):
            return int(e["dst"].split()[-1])
    for e in events:
        if e["type"].startswith("kv.") and e.get("engine") == "decode" and "engine_index" in e:
            return int(e["engine_index"])
    return 0


def engine_kv_events(events: Sequence[dict], engine: int) -> list[dict]:
    """A request's kv.* events on decode engine `engine` (a prefill engine's blocks, or another
    decode engine's, are block ids of another pool)."""
    return [e for e in events if e["type"].startswith("kv.") and e.get("engine") != "prefill"
            and int(e.get("engine_index", 0) if e.get("engine") == "decode" else 0) == engine]


def _block_events(events: Sequence[dict]) -> tuple[set[int], set[int], list[int]]:
    shared, freed, table = set(), set(), []
    for e in events:
        t = e["type"]
        if t == "kv.share":
            shared.update(e["blocks"])
        elif t == "kv.alloc":
            table = e["table"]
            freed.difference_update(e["blocks"])
        elif t in ("kv.free", "kv.rollback"):
            freed.update(e["blocks"])
    return shared, freed, table


STATE_RGB = {  # (cell, filled part)
    "mine": ((188, 208, 245), (70, 110, 200)), "shared": ((225, 198, 240), (160, 80, 200)),
    "other": ((251, 217, 181), (240, 140, 30)), "cached": ((205, 235, 211), None),
    "freed": ((255, 255, 255), None), "free": ((228, 231, 238), None)}
FREED_EDGE = (70, 110, 200)
MARK_RGB = (220, 20, 60)  # the frame of the block holding the selected pass's K and V


def block_states(pool: dict, request_id: str | None, events: Sequence[dict] = ()) -> list[str]:
    """The state of every block of the pool, as the viewer of request_id sees it."""
    owners = {int(k): v for k, v in pool["owners"].items()}
    shared, freed, _ = _block_events(events)
    states = []
    for b in range(pool["num_blocks"]):
        own = owners.get(b, [])
        if request_id in own:
            states.append("shared" if pool["ref"][b] > 1 or b in shared else "mine")
        elif own:
            states.append("other")
        elif b in freed:  # freed; a full block the prefix cache keeps is drawn as cached (the table says both)
            states.append("cached" if pool["cached"][b] else "freed")
        elif pool["cached"][b]:
            states.append("cached")
        else:
            states.append("free")
    return states


def grid_image(states: list[str], fill: dict[int, int], block_size: int, mark: int | None = None
               ) -> tuple[np.ndarray, int]:
    """One cell per block (a thousand-block pool is one <img>, not a thousand nodes):
    owned cells fill from the bottom as their tokens are written; mark: a block framed in
    red (the selected pass's). -> (RGB, columns)."""
    n = len(states)
    cols = 32 if n <= 256 else 64
    # the pool is the overview beside the request's table: a thousand blocks in ~380 px
    cell, gap = (12, 2) if n <= 512 else (5, 1)
    pitch = cell + gap
    rows = -(-n // cols)
    img = np.full((rows * pitch, cols * pitch, 3), 255, dtype=np.uint8)
    for b, state in enumerate(states):
        y, x = (b // cols) * pitch, (b % cols) * pitch
        bg, fg = STATE_RGB[state]
        if state == "freed":
            img[y:y + cell, x:x + cell] = FREED_EDGE
            img[y + 1:y + cell - 1, x + 1:x + cell - 1] = bg
            continue
        img[y:y + cell, x:x + cell] = bg
        if fg is not None:
            h = round(cell * min(fill.get(b, 0), block_size) / block_size)
            img[y + cell - h:y + cell, x:x + cell] = fg
    if mark is not None and 0 <= mark < n:
        y, x = (mark // cols) * pitch, (mark % cols) * pitch
        for t in range(2):  # two pixels wide: it must show on a 12 px cell
            img[y + t, x:x + cell] = img[y + cell - 1 - t, x:x + cell] = MARK_RGB
            img[y:y + cell, x + t] = img[y:y + cell, x + cell - 1 - t] = MARK_RGB
    return img, cols


def slot_of(position: int, table: Sequence[int], block_size: int) -> tuple[int, int] | None:
    """(block, slot) where the K and V of `position` live: the block table's entry
    position // block_size, slot position % block_size. None past the table."""
    i = position // block_size
    return (table[i], position % block_size) if 0 <= i < len(table) else None


def selected_slot_html(selection: Selection | None, table: Sequence[int], block_size: int,
                       states: list[str], lang: str = "en") -> tuple[str, int | None]:
    """The selected pass's K/V slot in words, and the block to frame ("", None: no selection)."""
    if selection is None or selection.read is None:
        return "", None
    p = selection.read
    at = slot_of(p, table, block_size)
    if at is None:
        missing = said_html_n(lang, "position {p}'s block is not in this request's block table ({n} block)",
                         "position {p}'s block is not in this request's block table ({n} blocks)", len(table), p=str(p))
        return f"<div class='tt-note'>{missing}</div>", None
    b, slot = at
    now = states[b] if b < len(states) else "free"
    gone = ("" if now in ("mine", "shared") else said_html(lang, " (freed since; the prefix cache keeps the block)")
            if now == "cached" else said_html(lang, " (freed since: the request no longer holds it)"))
    return ("<div>" + said_html(lang, "the selected pass wrote the keys and values of {token} (position {p}, every layer) "
                                 "into block {block}, slot {slot} of {size} (framed red){gone}: entry {entry} of the "
                                 "block table", token=selection.token(p), p=str(p), block=f"<b>{b}</b>", slot=str(slot),
                           size=str(block_size), gone=gone, entry=str(p // block_size)) + "</div>", b)


POOL_WORDS = {"mine": N_("this request's"), "shared": N_("shared via the prefix cache"),
              "other": N_("another request's"), "cached": N_("free, cached prefix"),
              "freed": N_("freed by this request")}  # a block's state, in its hover
LEGEND = (("mine", N_("this request")), ("shared", N_("shared via prefix cache")), ("other", N_("other requests")),
          ("cached", N_("free, cached prefix")), ("freed", N_("freed by this request")), ("free", N_("free")))


def kv_grid_html(pool: dict | None, request_id: str | None, events: Sequence[dict] = (),
                 model: dict | None = None, final_tokens: int | None = None,
                 selection: Selection | None = None, table_recorded: bool = True, lang: str = "en") -> str:
    """pool: the block pool (apply_kv_pool's form) after the step shown;
    events: this request's kv.* events; model: numbers for the size formula;
    final_tokens: K/V the request held when it finished (its blocks are gone from the pool);
    selection: the pass whose K/V slot is named and framed; table_recorded: False at capture level
    off, which records no kv.* events of the request (the pool's owners still show its blocks);
    lang: the language of its words."""
    if pool is None:
        return panel(gettext(lang, "KV cache"), empty(gettext(lang, "no KV-cache state yet")))
    n, bs = pool["num_blocks"], pool["block_size"]
    fill = {int(k): v for k, v in pool["fill"].items()}
    _, _, table = _block_events(events)
    states = block_states(pool, request_id, events)
    mine = [b for b, s in enumerate(states) if s in ("mine", "shared")]
    mine_tokens = sum(fill.get(b, 0) for b in mine)
    picked, mark = selected_slot_html(selection, table, bs, states, lang) if table_recorded else ("", None)
    upto = [e for e in events if e.get("step", -1) <= pool["step"]]  # the story as far as the pool drawn
    zoom, story = table_html(upto, pool, request_id, bs, selection.read if selection is not None and mark is not None
                             else None, final_tokens, lang) if table_recorded and request_id is not None else ("", None)
    head = header_html(gettext(lang, "KV cache"), selection)
    lines = _pool_lines(pool, request_id, table, states, (mine, mine_tokens), (story, final_tokens, table_recorded),
                        lang)
    body = f"{lines}{picked}</div>{zoom}" + _pool_picture(pool, states, fill, mark, lang)
    if model is None:
        return f'<div class="tt-panel">{head}{body}</div>'
    if request_id is None:  # idle: what a request of a thousand tokens would take
        formula = kv_formula_html(model, 1000, gettext(lang, "a 1,000-token request"), lang)
    elif not mine and final_tokens:
        formula = kv_formula_html(model, final_tokens, gettext(lang, "this request, when it finished"), lang)
    else:
        formula = kv_formula_html(model, mine_tokens, lang=lang)
    return f'<div class="tt-panel">{head}{body}{formula}</div>'


def _pool_lines(pool: dict, request_id: str | None, table: Sequence[int], states: list[str], mine: tuple,
                ended: tuple, lang: str) -> str:
    """The pool's size, this request's block table and holdings, the other requests' blocks and
    (after the finish) what became of the table: an open <div class='tt-lines'> (the caller closes it)."""
    (mine_blocks, mine_tokens), (story, final_tokens, table_recorded) = mine, ended
    others: dict[str, int] = {}
    for b, own in pool["owners"].items():
        for rid in own:
            if rid != request_id:
                others[rid] = others.get(rid, 0) + 1
    who = " · ".join(f"{esc(rid)}: {said_html_n(lang, '{n} block', '{n} blocks', c)}" for rid, c in sorted(others.items()))
    blocks = lambda k: said_html_n(lang, "{n} block", "{n} blocks", k)  # noqa: E731
    if request_id is None:  # the idle page: the pool as the engine holds it, no request of its own yet
        mine_line = " · " + said_html(lang, "no request yet: its block table and blocks show here once one runs")
    else:
        listed = (said_html(lang, "not recorded (capture level off)") if not table_recorded else
                  f"{esc(', '.join(map(str, table[:32])))}{'…' if len(table) > 32 else ''}" if table else
                  said_html(lang, "no block allocated yet"))
        holds = (said_html(lang, "this request holds {tokens} in {blocks}", blocks=blocks(len(mine_blocks)),
                      tokens=said_html_n(lang, "{n} token", "{n} tokens", mine_tokens))
                 if not (story and story.finished) else
                 said_html(lang, "finished: it held {tokens} in {blocks}, and holds none now", blocks=blocks(len(table)),
                      tokens=said_html_n(lang, "{n} token", "{n} tokens", final_tokens or 0)) if final_tokens else
                 said_html(lang, "finished: it holds no block now"))
        mine_line = " · " + said_html(lang, "block table: {table}", table=listed) + " · " + holds
    size_line = said_html(lang, "pool: {blocks} blocks × {size} tokens · engine step {step}",
                     blocks=f"<b>{number(lang, pool['num_blocks'])}</b>", size=str(pool["block_size"]),
                     step=str(pool["step"]))
    other = said_html(lang, "other requests: {who}", who=who or esc(gettext(lang, "none")))
    return (f"<div class='tt-lines'><div>{size_line}{mine_line}</div><div>{other}</div>"
            f"{finish_words(story, pool['block_size'], lang) if story else ''}")


def _pool_picture(pool: dict, states: list[str], fill: dict[int, int], mark: int | None, lang: str) -> str:
    """The whole pool as one picture (a cell a block, a hover per block in use) with its legend."""
    n, bs = pool["num_blocks"], pool["block_size"]
    owners = {int(k): v for k, v in pool["owners"].items()}
    counts = {s: 0 for s in STATE_RGB}
    for s in states:
        counts[s] += 1
    img, cols = grid_image(states, fill, bs, mark)
    blocks = {b: gettext(lang, "block {block} · {state}", block=b, state=gettext(lang, POOL_WORDS[st]))
              + (" · " + gettext(lang, "owners {owners} · ref {ref}", owners=", ".join(owners[b]), ref=pool["ref"][b])
                 if owners.get(b) else "")
              + " · " + gettext(lang, "{filled}/{size} tokens", filled=fill.get(b, 0), size=bs)
              for b, st in enumerate(states) if st != "free"}
    free = gettext(lang, "block {block} · free")  # a free block's hover: hover.js fills in {block}
    hover = hover_attr({"kind": "blocks", "w": cols, "h": -(-n // cols), "n": n, "blocks": blocks, "free": free})
    alt = gettext(lang, "KV block pool: {n} blocks, {cols} per row, block 0 top left", n=n, cols=cols)
    grid = hover_img(img, "tt-kv-img", alt, hover, img.shape[1], img.shape[0])
    data = " ".join(f'data-{s}="{c}"' for s, c in counts.items())
    note = said_html(lang, "block 0 top left, {cols} per row; a cell fills from the bottom as its {size} token slots are "
                      "written", cols=str(cols), size=str(bs))
    legend = "".join(f'<span class="tt-kv-key"><span class="tt-kv tt-kv-{s}"></span> {esc(gettext(lang, label))} '
                     f'{counts[s]}</span> ' for s, label in LEGEND)
    whole = said_html(lang, "the whole pool: {n} blocks", n=number(lang, n))
    return (f'<div class="tt-subtitle">{whole}</div>'
            f'<div class="tt-kv-grid" {data}>{grid}</div><div class="tt-legend">{legend}</div>'
            f'<div class="tt-note">{note}</div>')


def kv_formula_html(model: dict, tokens: int, who: str = "", lang: str = "en") -> str:
    """model: num_layers, num_kv_heads, head_dim, dtype, dtype_bytes, num_blocks, block_size,
    kv_cache_bytes (all read from the engine); who: whose tokens (default: this request)."""
    who = who or gettext(lang, "this request")
    if model.get("mla"):  # DeepSeek: the pool keeps the latent, not K and V
        return latent_formula_html(model, tokens, who)
    L, kvh, hd, b = model["num_layers"], model["num_kv_heads"], model["head_dim"], model["dtype_bytes"]
    per_token = 2 * L * kvh * hd * b
    capacity = model["num_blocks"] * model["block_size"]
    num = lambda x: number(lang, x)  # noqa: E731
    return ("<div class='tt-formula'>" + said_html(lang, "KV bytes = 2 × layers × kv_heads × head_dim × tokens × "
                                                    "bytes_per_value")
            + "<br>" + said_html(lang, "this model: 2 × {layers} × {kv_heads} × {head_dim} × tokens × {bytes} B ({dtype}) = "
                                  "{per_token}", layers=str(L), kv_heads=str(kvh), head_dim=str(hd), bytes=str(b),
                            dtype=esc(model.get("kv_dtype") or model["dtype"]),
                            per_token="<b>" + said_html(lang, "{bytes} B per token", bytes=num(per_token)) + "</b>")
            + "<br>" + said_html(lang, "{who}: {per_token} B × {tokens} tokens = {total}", who=esc(who),
                            per_token=num(per_token), tokens=num(tokens), total=f"<b>{esc(size(lang, per_token * tokens))}</b>")
            + "<br>" + said_html(lang, "pool: {blocks} blocks × {size} tokens = {capacity} tokens × {per_token} B = {total} "
                                  "allocated", blocks=num(model["num_blocks"]), size=str(model["block_size"]),
                            capacity=num(capacity), per_token=num(per_token),
                            total=f"<b>{esc(size(lang, model['kv_cache_bytes']))}</b>")
            + "</div>")
