"""Prefill and decode apart (engine/disagg): this request's KV pages moving from the prefill
engine's pool to the decode engine's, and what the handover cost beside the prefill.

Pure: a request's events in (its `kv.transfer` and, once it ended, its `finish`), escaped
HTML out. The pools are drawn from the transfer event alone, every engine's when it lists
them (P prefill engines on the left, D decode engines on the right), else its two: each
block a cell (a cell stands for several blocks in a big pool), this request's blocks marked
in the pool it left and the pool it went to.
"""
from __future__ import annotations

import math
from typing import Sequence

from visualizers import i18n
from visualizers._html import empty, esc, fmt_bytes, panel, said_html
from visualizers.i18n import N_, gettext, number, percent, size

MAX_CELLS, COLS, CELL = 128, 16, 11  # cells drawn per pool, per row; a cell's size in px
MINE, USED, FREE = "#466ec8", "#b8bccb", "#eceef4"


def transfer_summary(x: dict, ttft_s: float | None = None, lang: str = "en") -> dict:
    """The numbers the panel and the classroom quote, from a kv.transfer event (the engines
    named in `lang`)."""
    handover = x.get("handover_ms", x["queue_ms"] + x["wire_ms"])
    names = [_name(x.get(k), role, lang) for k, role in (("src", "prefill"), ("dst", "decode"))]
    ttft_ms = ttft_s * 1e3 if ttft_s else None
    return {"blocks": x["num_blocks"], "tokens": x["tokens"], "bytes": x["bytes"], "layers": len(x["layers"]),
            "backend": x["backend"], "wire_ms": x["wire_ms"], "queue_ms": x["queue_ms"], "prefill_ms": x["prefill_ms"],
            "handover_ms": handover, "ttft_ms": ttft_ms, "src_name": names[0], "dst_name": names[1],
            "engines": len(x.get("pools") or ()) or 2, "cached_tokens": x.get("cached_tokens", 0),
            "share_of_ttft": handover / ttft_ms if ttft_ms else None,
            "gbit_per_s": x["bytes"] * 8 / (x["wire_ms"] / 1e3) / 1e9 if x["wire_ms"] > 0 else None}


ROLE = {"prefill": N_("prefill"), "decode": N_("decode")}


def _name(engine: str | None, role: str, lang: str = "en") -> str:
    """ "prefill 1" -> "prefill engine 1"; an older event's "prefill" -> "the prefill engine"."""
    role_, _, index = (engine or role).partition(" ")
    role_ = gettext(lang, ROLE.get(role_, role_))
    return gettext(lang, "{role} engine {i}", role=role_, i=index) if index else \
        gettext(lang, "the {role} engine", role=role_)


def _pool_svg(x0: float, y0: float, title: str, pool: dict, mine: Sequence[int], note: str,
              lang: str = "en") -> tuple[str, float]:
    """One pool's cells from y0 down, this request's blocks marked: (svg, its last text line's y)."""
    n = max(1, int(pool.get("num_blocks") or 1))
    cells = min(n, MAX_CELLS)
    per = math.ceil(n / cells)
    marked = {b // per for b in mine}
    used = n - int(pool.get("free", n))
    out = [f'<text x="{x0}" y="{y0 + 12}" font-size="11" font-weight="600">{esc(title)}</text>']
    for c in range(math.ceil(n / per)):
        r, k = divmod(c, COLS)
        fill = MINE if c in marked else FREE
        out.append(f'<rect x="{x0 + k * CELL:.0f}" y="{y0 + 18 + r * CELL}" width="{CELL - 2}" height="{CELL - 2}" '
                   f'rx="1.5" fill="{fill}" stroke="{USED if fill == FREE else MINE}" stroke-width="0.6"/>')
    rows = math.ceil(math.ceil(n / per) / COLS)
    y = y0 + 18 + rows * CELL + 12
    scale = gettext(lang, " (a cell: {n} blocks)", n=per) if per > 1 else ""
    cached = int(pool.get("cached", 0))
    lines = [(gettext(lang, "{n} blocks of this request (marked)", n=len(mine)) if mine else
              gettext(lang, "not this request's engine"), "#222"),
             (gettext(lang, "{used} in use, {cached} cached, of {n}{scale}", used=number(lang, used),
                      cached=number(lang, cached), n=number(lang, n), scale=scale), "#222"), (note, "#666")]
    for i, (line, color) in enumerate(lines):
        out.append(f'<text x="{x0}" y="{y + 12 * i}" font-size="9.5" fill="{color}">{esc(line)}</text>')
    return "".join(out), y + 12 * (len(lines) - 1)


def _pools(x: dict, lang: str = "en") -> tuple[list[tuple], list[tuple]]:
    """(title, pool, this request's blocks, note) for each prefill engine and each decode engine:
    every engine's pool when the event lists them (several a side), else its two."""
    src, dst = x.get("src", "prefill"), x.get("dst", "decode")
    after_send = gettext(lang, "after the send: freed, full ones kept cached")
    allocated = gettext(lang, "its own blocks, allocated for the pages")
    if not x.get("pools"):
        return ([(gettext(lang, "prefill engine's pool"), x.get("src_pool", {}), x["src_blocks"], after_send)],
                [(gettext(lang, "decode engine's pool"), x.get("dst_pool", {}), x["dst_blocks"], allocated)])
    sides: tuple[list, list] = ([], [])
    for p in x["pools"]:
        name = p["engine"]
        role, _, index = name.partition(" ")
        title = gettext(lang, "{engine}'s pool", engine=_name(name, role, lang))
        if name == src:
            sides[0].append((title, p, x["src_blocks"], after_send))
        elif name == dst:
            sides[1].append((title, p, x["dst_blocks"], allocated))
        else:
            sides[role == "decode"].append((title, p, [], gettext(lang, "as its last send left it") if role == "prefill"
                                            else gettext(lang, "when this request's pages arrived")))
    return sides


def _bars(s: dict, lang: str = "en") -> str:
    """The prefill, the wait for decode blocks and the send, to one scale."""
    parts = [(gettext(lang, "prefill (on the prefill engine)"), s["prefill_ms"], "#466ec8"),
             (gettext(lang, "waiting for decode blocks / the pull"), s["queue_ms"], "#f0b41e"),
             (gettext(lang, "on the wire ({backend})", backend=s["backend"]), s["wire_ms"], "#d2504a")]
    top = max(1e-6, max(ms for _, ms, _ in parts))
    rows = []
    for label, ms, color in parts:
        w = max(1.0, 260 * ms / top)
        rows.append(f'<div style="display:flex;align-items:center;gap:6px;font-size:12px">'
                    f'<span style="width:230px">{esc(label)}</span>'
                    f'<span style="display:inline-block;width:{w:.0f}px;height:9px;background:{color};border-radius:2px">'
                    f'</span><span>{esc(number(lang, ms, 2))} ms</span></div>')
    return "".join(rows)


def disagg_panel_html(events: Sequence[dict], lang: str = "en") -> str:
    """The panel's body for a request served disaggregated; a note when it was not."""
    xs = [e for e in events if e["type"] == "kv.transfer"]
    if not xs:
        return empty(gettext(lang, "this request ran on one engine: prefill and decode shared its device and its KV "
                                   "pool (start the server with --disaggregate to give each its own)"))
    x = xs[-1]
    fin = next((e for e in events if e["type"] == "finish"), None)
    s = transfer_summary(x, (fin or {}).get("ttft"), lang)
    columns, arrow_ys, bottom = [], [], 0.0
    for x0, side in zip((0, 360), _pools(x, lang)):
        y, parts = 0.0, []
        for title, pool, mine, note in side:
            svg_part, end = _pool_svg(x0, y, title, pool, mine, note, lang)
            parts.append(svg_part)
            if mine:
                arrow_ys.append(y + 40)
            y = end + 16
        columns.append("".join(parts))
        bottom = max(bottom, y)
    y1, y2 = (arrow_ys + [40, 40])[:2]
    above = gettext(lang, "{blocks} blocks · {size}", blocks=s["blocks"], size=size(lang, s["bytes"]))
    below = gettext(lang, "{layers} layers · {ms} ms", layers=s["layers"], ms=number(lang, s["wire_ms"], 2))
    mid = (y1 + y2) / 2
    arrow = (f'<line x1="192" y1="{y1:.0f}" x2="348" y2="{y2:.0f}" stroke="#d2504a" stroke-width="2" '
             f'marker-end="url(#tt-disagg-arrow)"/>'
             f'<text x="270" y="{mid - 8:.0f}" font-size="10" text-anchor="middle">{esc(above)}</text>'
             f'<text x="270" y="{mid + 14:.0f}" font-size="10" text-anchor="middle">{esc(below)}</text>')
    defs = ('<defs><marker id="tt-disagg-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" '
            'markerHeight="6" orient="auto"><path d="M0,0L10,5L0,10z" fill="#d2504a"/></marker></defs>')
    height = bottom - 8
    svg = (f'<svg viewBox="0 0 590 {height:.0f}" width="100%" style="max-width:660px">{defs}{columns[0]}{arrow}'
           f'{columns[1]}</svg>')
    return svg + _bars(s, lang) + _handover_words(s, lang)


def _handover_words(s: dict, lang: str) -> str:
    """The handover in words: where the prompt ran, what crossed, how long it took; how the
    engines were picked when there are several a side."""
    share = said_html(lang, "; the handover was {share} of its time to first token ({ttft} ms)",
                      share=f"<b>{percent(lang, s['share_of_ttft'])}</b>", ttft=number(lang, s["ttft_ms"], 1)) \
        if s["share_of_ttft"] is not None else ""
    rate = gettext(lang, " ({rate} Gbit/s)", rate=number(lang, s["gbit_per_s"], 2)) if s["gbit_per_s"] else ""
    text = "<p>" + said_html(
        lang, "This request's prompt ({tokens} tokens) was computed on {src}, which also drew the first token (as "
              "vLLM's disaggregated prefill does); its KV pages, every layer, {moved}, then went to {dst} over "
              "torch.distributed ({backend}) in {wire}{rate}, after waiting {queue} ms for blocks there{share}. The "
              "decode engine appended the token and decoded the rest from its own pool.",
        tokens=number(lang, s["tokens"]), src=f"<b>{esc(s['src_name'])}</b>",
        moved="<b>" + said_html(lang, "{blocks} blocks, {size}", blocks=str(s["blocks"]),
                                size=esc(size(lang, s["bytes"]))) + "</b>",
        dst=f"<b>{esc(s['dst_name'])}</b>", backend=esc(s["backend"]),
        wire=f"<b>{number(lang, s['wire_ms'], 2)} ms</b>", rate=esc(rate), queue=number(lang, s["queue_ms"], 2),
        share=share) + "</p>"
    if s["engines"] > 2:  # several engines a side: how this one was picked
        text += "<p>" + said_html(lang, "{engines} engines. A prompt goes to the prefill engine with the fewest prefill "
                                        "tokens to compute, its own included less the prefix that engine holds cached "
                                        "(here {cached} of its tokens came from that cache); its pages go to the "
                                        "decode engine with the most free blocks.", engines=str(s["engines"]),
                                  cached=number(lang, s["cached_tokens"])) + "</p>"
    return text


def _engine_name(engine: str | None, role: str, lang: str) -> str:
    """_name() in lang: "prefill engine 1", "the decode engine"."""
    role_, _, index = (engine or role).partition(" ")
    word = i18n.gettext(lang, "prefill") if role_ == "prefill" else i18n.gettext(lang, "decode") \
        if role_ == "decode" else role_
    return (i18n.gettext(lang, "{role} engine {index}", role=word, index=index) if index else
            i18n.gettext(lang, "the {role} engine", role=word))


def disagg_stage_html(x: dict, ttft_s: float | None = None, lang: str = i18n.DEFAULT) -> str:
    """The stage's words (page and classroom): this request's handover, its numbers."""
    s = transfer_summary(x, ttft_s)
    num = i18n.number
    share = said_html(lang, ", {share} of its {ttft} ms to the first token",
                      share=esc(i18n.percent(lang, s["share_of_ttft"])), ttft=num(lang, s["ttft_ms"], 1)) \
        if s["share_of_ttft"] is not None else ""
    src = _engine_name(x.get("src"), "prefill", lang)
    return "<p>" + said_html(
        lang, "{name}: this request was prefilled on one engine and decoded on another, each with its own KV pool. "
              "{src} computed its {tokens} prompt tokens in {prefill} ms and drew the first token; then its KV cache, "
              "{blocks} blocks of {layers} layers, {bytes}, crossed to {dst} in {wire} on the wire ({backend}) "
              "after {queue} ms of waiting: a handover of {handover} ms{share}. The price of keeping long prefills "
              "out of the decoding requests' steps.",
        name="<b>" + said_html(lang, "Prefill and decode apart") + "</b>", src=esc(src[:1].upper() + src[1:]),
        tokens=num(lang, s["tokens"]), prefill=num(lang, s["prefill_ms"], 1), blocks=str(s["blocks"]),
        layers=str(s["layers"]), bytes=f"<b>{esc(fmt_bytes(s['bytes']))}</b>",
        dst=esc(_engine_name(x.get("dst"), "decode", lang)), wire=f"<b>{num(lang, s['wire_ms'], 2)} ms</b>",
        backend=esc(s["backend"]), queue=num(lang, s["queue_ms"], 1), handover=num(lang, s["handover_ms"], 1),
        share=share) + "</p>"


def disagg_html(events: Sequence[dict], lang: str = "en") -> str:
    return panel(gettext(lang, "Prefill and decode apart"), disagg_panel_html(events, lang), "engine/disagg")
