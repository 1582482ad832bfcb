"""Stage 4: embedding lookup: each token id selects one row of the embedding matrix."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from visualizers import i18n
from visualizers._html import colormap, empty, esc, fixed, hover_attr, hover_img, said_html
from visualizers.compact import array
from visualizers.selection import Selection, header_html

PICKED_RGB = np.array([220, 20, 60], dtype=np.uint8)  # the gutter of the selected pass's row
GUTTER_RGB = np.array([236, 237, 242], dtype=np.uint8)


def embedding_matrix(embeds: Sequence[dict]) -> tuple[np.ndarray, list[int]]:
    """Rows of every `embed` event (prefill chunks, then one per decode step), by position."""
    by_pos: dict[int, np.ndarray] = {}
    ids: dict[int, int] = {}
    for ev in embeds:
        for i, (row, tid) in enumerate(zip(array(ev["rows"]), ev["token_ids"])):
            by_pos[ev["start"] + i] = row
            ids[ev["start"] + i] = tid
    order = sorted(by_pos)
    if not order:
        return np.zeros((0, 0)), []
    return np.array([by_pos[p] for p in order], dtype=float), [ids[p] for p in order]


def _panel(body: str, selection: Selection | None, frozen: str, lang: str) -> str:
    return '<div class="tt-panel">' + header_html(i18n.N_("Embedding"), selection, frozen, lang=lang) + body + "</div>"


def embedding_html(embeds: Sequence[dict], vocab_size: int | None = None, d_model: int | None = None,
                   selection: Selection | None = None, frozen: str = "", lang: str = i18n.DEFAULT) -> str:
    """vocab_size, d_model: the model's, named before any row is captured. selection: the pass
    whose row is marked (its read position); frozen: the byte cap's warning for the header."""
    if not embeds:
        none = (i18n.gettext(lang, "no embedding rows yet: each token will select one row of the [{rows} × {dims}] "
                                   "embedding matrix (capture level 'full' records them)",
                             rows=i18n.number(lang, vocab_size), dims=i18n.number(lang, d_model))
                if vocab_size and d_model else
                i18n.gettext(lang, "no embedding rows yet (capture level 'full' records them)"))
        return _panel(empty(none), None, frozen, lang)
    mat, ids = embedding_matrix(embeds)
    d_model = embeds[-1]["shape"][1]
    scale = float(np.abs(mat).max()) or 1.0
    positions = sorted({ev["start"] + i for ev in embeds for i in range(len(ev["token_ids"]))})
    picked = selection.read if selection is not None else None
    gutter = np.repeat(GUTTER_RGB[None, None, :], len(positions), axis=0)
    if picked in positions:
        gutter[positions.index(picked)] = PICKED_RGB
    rgb = np.concatenate([gutter, colormap(mat / scale, diverging=True)], axis=1)
    n, dims = mat.shape
    cell_w = max(1, 640 // (dims + 1))
    row_h = max(2, min(8, 480 // n))  # every token row stays visible, however many there are
    title = i18n.gettext(lang, "embedding rows: {n} tokens x {dims} dims (of {d_model})", n=str(n), dims=str(dims),
                         d_model=str(d_model))
    info = f"<div class='tt-lines'><div>{_shape(lang, mat, d_model, scale)}</div><div>" + said_html(
        lang, "first ids: {ids}", ids=esc(', '.join(map(str, ids[:16]))) + ('…' if len(ids) > 16 else '')) \
        + f"</div>{_picked_line(mat, ids, positions, selection, lang)}</div>"
    row_name = i18n.gettext(lang, "{p} (id {id})")  # once, filled per row
    hover = hover_attr({"w": dims + 1, "h": n, "x0": 1,
                        "rows": [row_name.format(p=p, id=t) for p, t in zip(positions, ids)],
                        "row_name": i18n.gettext(lang, "token"),
                        "gutter": [i18n.gettext(lang, "the selected pass's row") if p == picked else ""
                                   for p in positions],
                        "fmt": i18n.gettext(lang, "token {r} · dim {c} · value {v}"),
                        "ctx": i18n.gettext(lang, "embedding row (of d_model {d_model})",
                                            d_model=i18n.number(lang, d_model))},
                       mat, signed=True)
    img = hover_img(rgb, "tt-heat tt-embed", title, hover, (dims + 1) * cell_w, n * row_h)
    return _panel(info + f'<div class="tt-strip">{img}</div>', selection, frozen, lang)


def _shape(lang: str, mat: np.ndarray, d_model: int, scale: float) -> str:
    """The matrix's shape, the dims shown, the values' range and colour scale (HTML)."""
    n, dims = mat.shape
    shown = "" if dims == d_model else said_html(lang, " · showing the first {dims} of {d_model} dims", dims=str(dims),
                                                 d_model=i18n.number(lang, d_model))
    return said_html(lang, "shape {shape}{shown} · values in [{low}, {high}] · colour: blue − / red + (±{scale})",
                     shape="<b>" + said_html(lang, "[{n} tokens × d_model {d_model}]", n=str(n),
                                             d_model=i18n.number(lang, d_model)) + "</b>",
                     shown=shown, low=fixed(mat.min(), 3), high=fixed(mat.max(), 3), scale=f"{scale:.3f}")


def _picked_line(mat: np.ndarray, ids: list[int], positions: list[int], selection: Selection | None,
                 lang: str = i18n.DEFAULT) -> str:
    """The selected pass's row in words: its token, id and first values (or why it is absent)."""
    if selection is None or selection.read is None:
        return ""
    p = selection.read
    if p not in positions:
        return "<div class='tt-note'>" + said_html(lang, "row {p} (the selected pass's input) was not captured: rows "
                                                         "{first}–{last} are", p=str(p), first=str(positions[0]),
                                                   last=str(positions[-1])) + "</div>"
    r = positions.index(p)
    vals = ", ".join(fixed(v, 3) for v in mat[r, :6])
    return "<div>" + said_html(lang, "row {p} (marked red at the left): token {token}, id {id} · the vector the pass "
                                     "starts from: [{values}, …]", p=str(p), token=selection.token(p), id=str(ids[r]),
                               values=vals) + "</div>"
