"""Stage 5b: the logit lens: what the model would answer if it stopped after each layer.

One `logit_lens` event per generated token: for each point of the residual stream (after
the embedding, after every layer; the last is the model's own output) the top candidates
of the final norm + LM head, and the rank and probability of the token finally chosen.
Drawn as a layers x candidates grid: rows are layers (the embedding on top, the output at
the bottom), columns the candidates by rank; shading is the probability, the chosen token
is outlined wherever it appears, and the last column follows it down the stack.
"""
from __future__ import annotations

from typing import Sequence

from visualizers._html import empty, esc, prob, said_html
from visualizers.char_runs import label_html, label_title, lone_html, lone_title
from visualizers.compact import lens_layers
from visualizers.i18n import gettext, number
from visualizers.sampling import drawn_by
from visualizers.selection import Selection, header_html


def row_label(i: int, n_rows: int, lang: str = "en") -> str:
    """Row i of n_rows: 0 is the embedding, i is after layer i - 1 (the last: the output)."""
    if i == 0:
        return gettext(lang, "embedding")
    if i == n_rows - 1:
        return gettext(lang, "layer {layer} = output", layer=i - 1)
    return gettext(lang, "layer {layer}", layer=i - 1)


def _shade(p: float) -> str:
    # a probability as the alpha of one hue: light cells are unlikely, saturated ones sure
    p = max(0.0, min(1.0, p))
    return f"background:rgba(46,110,200,{p * 0.85 + 0.04:.2f})" + (";color:#fff" if p > 0.45 else "")


def _visible(text: str, tid: int, before: Sequence[str] = ()) -> str:
    """A candidate's text as the cell shows it: whitespace as the marks every panel uses
    (show_piece: ␣ ↵ ⍽ …), a piece that finishes the character the tokens before it began as
    that character, dashed (char_runs), any other piece as its bytes; an empty one as its id."""
    if not text:
        return f"#{tid}"
    return label_html([*before, text], len(before)) if before and "<0x" in text else lone_html(text)


def _bytes_note(text: str, before: Sequence[str] = ()) -> str:
    note = (label_title([*before, text], len(before)) if before else "") or lone_title(text)
    return f" · {note}" if note else ""


def select(events: Sequence[dict], position: int | None = None) -> dict | None:
    """The event of the token at `position` (None or not traced: the newest)."""
    if not events:
        return None
    if position is not None:
        for e in events:
            if e["position"] == position:
                return e
    # (by position: events come in the order computed, a live step's before the steps between live ones)
    return max(events, key=lambda e: e["position"])


def first_top(layers: Sequence[dict]) -> int | None:
    """The first row from which the chosen token stays the top candidate to the end."""
    at = None
    for i, row in enumerate(layers):
        if row["chosen_rank"] == 1:
            at = i if at is None else at
        else:
            at = None
    return at


def _panel(body: str, selection: Selection | None = None, frozen: str = "", lang: str = "en") -> str:
    return '<div class="tt-panel">' + header_html(gettext(lang, "Logit lens"), selection, frozen) + body + "</div>"


def logit_lens_html(events: Sequence[dict], position: int | None = None, labels: Sequence[str] = (),
                    selection: Selection | None = None, frozen: str = "", lang: str = "en") -> str:
    """events: this request's `logit_lens` events; position: the predicted token whose lens to
    show (an event's own position; default: the newest); selection: the selected pass (its
    lens: the one of the token it predicted; it wins over position); labels: token text by
    position (for the context line); frozen: the byte cap's warning for the header; lang: the
    language of its words."""
    # by position: a newest token's lens comes at once, those before it may follow (engine/trace/lens_queue.py)
    events = sorted(events, key=lambda e: e["position"])
    if selection is not None and events:
        at, why = drawn_by(events, selection, "lens", lang)
        if at is None:
            why = why or said_html(lang, "no lens for this pass")
            return _panel(f"<div class='tt-empty'>{why}</div>", selection, frozen, lang)
        position = events[at]["position"]
    ev = select(events, position)
    if ev is None:
        return _panel(empty(gettext(lang, "no token generated yet (capture level 'full' records the logit lens)")),
                      None, frozen, lang)
    rows = lens_layers(ev)  # the event holds columns (compact form)
    pos = ev["position"]
    before = list(labels[max(0, pos - 3):pos])  # the tokens a candidate piece may finish a character of
    n = len(rows)
    chosen = ev["token_id"]
    k = max(len(r["top_ids"]) for r in rows)
    head = "".join(f"<th>#{j + 1}</th>" for j in range(k))
    body = []
    for i, r in enumerate(rows):
        where = row_label(i, n, lang)
        cells = []
        for j, (tid, text, p) in enumerate(zip(r["top_ids"], r["top_texts"], r["top_probs"])):
            mark = " tt-lens-chosen" if tid == chosen else ""
            title = gettext(lang, "{where} · candidate #{rank}: {text} (id {id}) · p={p}", where=where, rank=j + 1,
                            text=repr(text), id=tid, p=prob(p)) + _bytes_note(text, before)
            cells.append(f'<td class="tt-lens-cell{mark}" style="{_shade(p)}" title="{esc(title)}">'
                         f"<code>{_visible(text, tid, before)}</code></td>")
        cells += ["<td></td>"] * (k - len(r["top_ids"]))
        cp, rank = r["chosen_prob"], r["chosen_rank"]
        ctitle = gettext(lang, "{where} · the chosen token {text}: rank {rank}, p={p}", where=where,
                         text=repr(ev["token_text"]), rank=number(lang, rank), p=prob(cp))
        body.append(f'<tr class="tt-lens-row{" tt-lens-out" if i == n - 1 else ""}"><th title="{esc(where)}">'
                    f"{esc(where).replace('embedding', 'embed&shy;ding')}</th>{''.join(cells)}"
                    f'<td class="tt-lens-rank" style="{_shade(cp)}" title="{esc(ctitle)}">'  # wraps at " · " only
                    f'<span class="tt-nw">#{rank:,}</span> · <span class="tt-nw">{prob(cp)}</span></td></tr>')
    after, chosen_head = said_html(lang, "after"), said_html(lang, "chosen: rank · p")
    table = (f"<table class='tt-table tt-lens'><thead><tr><th>{after}</th>{head}<th>{chosen_head}</th></tr>"
             f"</thead><tbody>{''.join(body)}</tbody></table>")
    top = first_top(rows)
    ever = next((i for i, r in enumerate(rows) if r["chosen_rank"] == 1), None)
    known = _verdict(rows, lang)
    ctx = said_html(lang, " after {token}", token=f"<code>{label_html(labels, pos - 1)}</code>") \
        if 0 < pos <= len(labels) else ""
    # the chosen token in its context where the labels reach it: a piece drawn as its character
    chosen_html = label_html(labels, pos) if 0 <= pos < len(labels) and labels[pos] == ev["token_text"] \
        else lone_html(ev["token_text"])
    idx = next((i for i, e in enumerate(events) if e is ev), len(events) - 1)
    line = said_html(lang, "token {i} of {n} · position {position}{context} · chosen {token} (id {id}): {verdict}",
                i=str(idx + 1), n=str(len(events)), position=str(pos), context=ctx,
                token=f"<code>{chosen_html}</code>", id=esc(chosen), verdict=known)
    none = said_html(lang, "position {position} has no lens (the lens is recorded for generated tokens, not the "
                      "prompt's): showing the newest", position=str(position)) \
        if position is not None and pos != position else ""
    each = said_html(lang, "each row: the residual stream after that layer through the final norm and the LM head "
                      "(top {k}; shading: probability; outlined: the chosen token)", k=str(k))
    info = (f"<div class='tt-lines'><div>{line}</div>" + (f"<div class='tt-note'>{none}</div>" if none else "")
            + f"<div>{each}</div></div>")
    return _panel(info + f"<div class='tt-lens-wrap'>{table}</div>", selection, frozen, lang)


def _verdict(rows: Sequence[dict], lang: str) -> str:
    """Where the chosen token becomes the top candidate, in words (HTML)."""
    n, top = len(rows), first_top(rows)
    ever = next((i for i, r in enumerate(rows) if r["chosen_rank"] == 1), None)
    if ever is None:
        return said_html(lang, "it is never the top candidate (a draw below the top)")
    if top is None:
        return said_html(lang, "it is the top candidate at {row} but not at the output (a draw below the top)",
                    row=esc(row_label(ever, n, lang)))
    if top < n - 1:
        return said_html(lang, "it is the top candidate from {row} on", row=esc(row_label(top, n, lang)))
    if ever == n - 1:
        return said_html(lang, "it is the top candidate only at the output")
    return said_html(lang, "it is the top candidate first at {row}, for good only at the output",
                row=esc(row_label(ever, n, lang)))
