"""Stage 4: embedding lookup: each token id selects one row of the embedding matrix."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from visualizers._html import colormap, empty, esc, fixed, hover_attr, hover_img
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


def _panel(body: str, selection: Selection | None, frozen: str) -> str:
    return '<div class="tt-panel">' + header_html("Embedding", selection, frozen) + body + "</div>"


def embedding_html(embeds: Sequence[dict], vocab_size: int | None = None, d_model: int | None = None,
                   selection: Selection | None = None, frozen: str = "") -> str:
    """vocab_size, d_model: the model's, named before any row is captured. selection: the pass
    whose row is marked (its read position); frozen: the byte cap's warning for the header."""
    if not embeds:
        table = (f": each token will select one row of the [{vocab_size:,} × {d_model:,}] embedding matrix"
                 if vocab_size and d_model else "")
        return _panel(empty(f"no embedding rows yet{table} (capture level 'full' records them)"), None, frozen)
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
    title = f"embedding rows: {n} tokens x {dims} dims (of {d_model})"
    info = (f"<div class='tt-lines'><div>shape <b>[{n} tokens × d_model {d_model:,}]</b>"
            f"{'' if dims == d_model else f' · showing the first {dims} of {d_model:,} dims'}"
            f" · values in [{fixed(mat.min(), 3)}, {fixed(mat.max(), 3)}] · colour: blue − / red + "
            f"(±{scale:.3f})</div><div>first ids: {esc(', '.join(map(str, ids[:16])))}"
            f"{'…' if len(ids) > 16 else ''}</div>{_picked_line(mat, ids, positions, selection)}</div>")
    hover = hover_attr({"w": dims + 1, "h": n, "x0": 1, "rows": [f"{p} (id {t})" for p, t in zip(positions, ids)],
                        "row_name": "token", "gutter": ["the selected pass's row" if p == picked else ""
                                                        for p in positions],
                        "fmt": "token {r} · dim {c} · value {v}", "ctx": f"embedding row (of d_model {d_model:,})"},
                       mat, signed=True)
    img = hover_img(rgb, "tt-heat tt-embed", title, hover, (dims + 1) * cell_w, n * row_h)
    return _panel(info + f'<div class="tt-strip">{img}</div>', selection, frozen)


def _picked_line(mat: np.ndarray, ids: list[int], positions: list[int], selection: Selection | None) -> str:
    """The selected pass's row in words: its token, id and first values (or why it is absent)."""
    if selection is None or selection.read is None:
        return ""
    p = selection.read
    if p not in positions:
        return (f"<div class='tt-note'>row {p} (the selected pass's input) was not captured: rows "
                f"{positions[0]}–{positions[-1]} are</div>")
    r = positions.index(p)
    vals = ", ".join(fixed(v, 3) for v in mat[r, :6])
    return (f"<div>row {p} (marked red at the left): token {selection.token(p)}, id {ids[r]} · "
            f"the vector the pass starts from: [{vals}, …]</div>")
