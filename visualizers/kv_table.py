"""Stage 7's zoom: this request's block table drawn large, one entry per block in table order,
each block's token slots filling as its K/V are written; which blocks the prefix cache served
(shared), and after the finish what was freed and what stays in the prefix cache.

Read from the request's own kv.* events (engine/trace/events.py): kv.share (blocks served by
the prefix cache), kv.alloc (the table after each allocation), kv.fill (the slots each step
wrote), kv.rollback (rejected speculative positions) and kv.free (at the finish: the blocks no
one references now, the ones of them the prefix cache keeps, and references dropped on blocks
another request still holds); the pool, while the request holds its blocks, for their fill."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from visualizers._html import esc, hover_attr, hover_img, said_html, said_html_n
from visualizers.i18n import N_, gettext, number

MAX_ENTRIES = 64  # table entries drawn (1,024 tokens at 16 a block); the rest are counted
SLOT_PX, SLOT_GAP = 11, 2
ROW_SLOTS = 8  # slots a row inside one block's picture
RGB = {  # entry state -> (an empty slot, a written slot)
    "mine": ((214, 226, 248), (70, 110, 200)), "shared": ((234, 214, 244), (160, 80, 200)),
    "cached": ((214, 238, 220), (92, 174, 111)), "freed": ((244, 244, 246), (190, 192, 200)),
    "released": ((234, 214, 244), (190, 150, 215)), "rolled back": ((244, 244, 246), (190, 192, 200))}
WORDS = {"mine": N_("this request's"), "shared": N_("shared: served by the prefix cache"),
         "cached": N_("freed, stays in the prefix cache"), "freed": N_("freed: back to the free list"),
         "released": N_("released: another request still holds it"),
         "rolled back": N_("rolled back (rejected drafts)")}
MARK = (220, 20, 60)


@dataclass
class TableStory:
    """What the request's kv.* events say of its block table."""
    table: list[int] = field(default_factory=list)
    shared: set[int] = field(default_factory=set)  # served by the prefix cache at admission
    fill: dict[int, int] = field(default_factory=dict)  # block -> slots written (by this request's steps)
    rolled: set[int] = field(default_factory=set)
    finished: bool = False  # a kv.free came: the table is gone
    freed: set[int] = field(default_factory=set)  # nobody references them now
    kept: set[int] = field(default_factory=set)  # ... of which the prefix cache keeps these
    released: int = 0  # references dropped on blocks still held by another request
    step: int | None = None  # the kv.free's step


def story_of(events: Sequence[dict], block_size: int) -> TableStory:
    s = TableStory()
    for e in events:
        t = e["type"]
        if t == "kv.share":
            s.shared.update(e["blocks"])
            s.table = list(e["blocks"]) if not s.table else s.table
        elif t == "kv.alloc":
            s.table = list(e["table"])
            s.rolled.difference_update(e["blocks"])
            s.finished = False
        elif t == "kv.fill":
            for f in e["fills"]:
                s.fill[f["block"]] = max(s.fill.get(f["block"], 0), int(f["offset"]) + int(f["count"]))
        elif t == "kv.rollback":
            s.rolled.update(e["blocks"])
        elif t == "kv.free":
            s.finished, s.step = True, e.get("step")
            s.freed, s.kept, s.released = set(e["blocks"]), set(e.get("cached") or ()), int(e.get("released") or 0)
    for b in s.shared:
        s.fill[b] = block_size  # a full block, written by the request that left it
    return s


def entry_state(s: TableStory, b: int, pool: dict | None) -> str:
    if s.finished:
        return "cached" if b in s.kept else "freed" if b in s.freed else "released"
    if b in s.rolled:
        return "rolled back"
    shared_now = pool is not None and b < len(pool["ref"]) and pool["ref"][b] > 1
    return "shared" if b in s.shared or shared_now else "mine"


def _slots_image(state: str, filled: int, block_size: int, mark: int | None) -> np.ndarray:
    cols = min(ROW_SLOTS, block_size)
    rows = -(-block_size // cols)
    pitch = SLOT_PX + SLOT_GAP
    img = np.full((rows * pitch - SLOT_GAP, cols * pitch - SLOT_GAP, 3), 255, dtype=np.uint8)
    empty, written = RGB[state]
    for i in range(block_size):
        y, x = (i // cols) * pitch, (i % cols) * pitch
        img[y:y + SLOT_PX, x:x + SLOT_PX] = written if i < filled else empty
        if i == mark:
            for t in range(2):
                img[y + t, x:x + SLOT_PX] = img[y + SLOT_PX - 1 - t, x:x + SLOT_PX] = MARK
                img[y:y + SLOT_PX, x + t] = img[y:y + SLOT_PX, x + SLOT_PX - 1 - t] = MARK
    return img


def table_html(events: Sequence[dict], pool: dict | None, request_id: str | None, block_size: int,
               picked: int | None = None, final_tokens: int | None = None, lang: str = "en") -> tuple[str, TableStory]:
    """The block table zoomed: an entry per block (table index, block id, the positions it
    holds, its slots, its state). picked: a position whose slot is framed red; final_tokens: the
    K/V the request held at its finish (slots past it held only rejected drafts). -> (HTML, story)."""
    s = story_of(events, block_size)
    if not s.table:
        return "", s
    owners = {int(k): v for k, v in (pool or {}).get("owners", {}).items()}
    fill_now = {int(k): v for k, v in (pool or {}).get("fill", {}).items()}
    cells = []
    for i, b in enumerate(s.table[:MAX_ENTRIES]):
        state = entry_state(s, b, pool)
        held = request_id in owners.get(b, ())
        filled = min(block_size, fill_now.get(b, 0) if held else s.fill.get(b, 0))
        lo = i * block_size
        if s.finished and final_tokens is not None:  # a verify step's rejected drafts wrote past the answer
            filled = min(filled, max(0, final_tokens - lo))
        where = (gettext(lang, "positions {first}–{last}", first=lo, last=lo + filled - 1) if filled > 1 else
                 gettext(lang, "position {position}", position=lo) if filled else gettext(lang, "no token yet"))
        origin = gettext(lang, "K/V from the prefix cache") if b in s.shared else \
            gettext(lang, "K/V computed by this request")
        state_words = gettext(lang, WORDS[state])
        mark = picked - lo if picked is not None and lo <= picked < lo + block_size else None
        img = _slots_image(state, filled, block_size, mark)
        entry = said_html(lang, "#{i} → block {block}", i=str(i), block=f"<b>{b}</b>")
        tip = hover_attr({"kind": "blocks", "w": 1, "h": 1, "n": 1, "blocks": {
            0: gettext(lang, "table entry {i} · block {block} · {state} · {origin} · {filled}/{size} slots · {where}",
                       i=i, block=b, state=state_words, origin=origin, filled=filled, size=block_size, where=where)}})
        pic = hover_img(img, "tt-kvt-img", gettext(lang, "block {block}: {filled} of {size} slots", block=b,
                                                   filled=filled, size=block_size), tip, img.shape[1] * 2,
                        img.shape[0] * 2)
        cells.append(f'<div class="tt-kvt-entry tt-kvt-{state.replace(" ", "-")}{" tt-kvt-picked" if mark is not None else ""}" '
                     f'data-block="{b}" data-state="{esc(state)}" data-fill="{filled}">'
                     f'<div class="tt-kvt-head">{entry}</div>{pic}'
                     f'<div class="tt-kvt-foot">{esc(where)} · {filled}/{block_size}</div>'
                     f'<div class="tt-kvt-state">{esc(state_words)}'
                     f'{"<br>" + esc(origin) if s.finished and b in s.shared else ""}</div></div>')
    more = len(s.table) - MAX_ENTRIES
    rest = "<div class='tt-note'>" + said_html_n(lang, "… and {n} more entry not drawn", "… and {n} more entries not drawn",
                                            more) + "</div>" if more > 0 else ""
    title = (gettext(lang, "this request's block table at the finish: what became of each block") if s.finished else
             gettext(lang, "this request's block table: entry i holds positions {size}·i to {size}·i + {last}, its "
                           "slots filling as their K/V are written", size=block_size, last=block_size - 1))
    return (f"<div class='tt-kvt'><div class='tt-subtitle'>{esc(title)}</div>"
            f"<div class='tt-kvt-row'>{''.join(cells)}</div>{rest}</div>"), s


def finish_words(s: TableStory, block_size: int, lang: str = "en") -> str:
    """After the finish: what was freed and what the prefix cache keeps (HTML, escaped)."""
    if not s.finished:
        return ""
    kept = [b for b in s.table if b in s.kept]
    freed = [b for b in s.table if b in s.freed and b not in s.kept]
    held = [b for b in s.table if b not in s.freed]
    ids = lambda bs: esc(", ".join(map(str, bs[:16])) + ("…" if len(bs) > 16 else ""))  # noqa: E731
    parts = [said_html_n(lang, "at its finish (engine step {step}) the request gave back its table of {n} block:",
                    "at its finish (engine step {step}) the request gave back its table of {n} blocks:",
                    len(s.table), step=esc(s.step))]
    if freed:
        parts.append(said_html_n(lang, "{n} block freed ({ids}): back to the free list, reused first",
                            "{n} blocks freed ({ids}): back to the free list, reused first", len(freed), ids=ids(freed)))
    if kept:
        lead = 0  # a hit walks the hash chain from entry 0: only a leading run of cached blocks is found
        while lead < len(s.table) and (s.table[lead] in s.kept or (s.table[lead] in held and s.table[lead] in s.shared)):
            lead += 1
        reach = (said_html(lang, "a later request that begins with the same {tokens} tokens (and goes on past them) "
                            "finds them", tokens=number(lang, lead * block_size)) if lead and lead == len(kept) else
                 said_html(lang, "a later request that begins with the same {tokens} tokens (and goes on past them) "
                            "finds the first {lead}", tokens=number(lang, lead * block_size), lead=str(lead)) if lead else
                 said_html(lang, "no later request can find them before the blocks ahead of them in the chain"))
        parts.append(said_html_n(lang, "{n} full block ({ids}) free but kept in the prefix cache: {reach}",
                            "{n} full blocks ({ids}) free but kept in the prefix cache: {reach}", len(kept),
                            ids=ids(kept), reach=reach))
    if held:
        parts.append(said_html_n(lang, "{n} block ({ids}) still held by another request (its reference dropped)",
                            "{n} blocks ({ids}) still held by another request (its reference dropped)", len(held),
                            ids=ids(held)))
    end = "。" if lang == "zh_CN" else "."
    sep = "；" if lang == "zh_CN" else "; "
    return f"<div class='tt-kvt-after'>{parts[0]} {sep.join(parts[1:])}{end}</div>"
