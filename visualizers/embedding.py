"""Stage 4: embedding lookup: each token id selects one row of the embedding matrix."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from visualizers.compact import array
from visualizers._html import colormap, empty, esc, fixed, hover_attr, hover_img, panel


def embedding_matrix(embeds: Sequence[dict]) -> tuple[np.ndarray, list[int]]:
    """Rows of every `embed` event (prefill chunks, then one per decode step), by position."""
    by_pos: dict[int, list[float]] = {}
    ids: dict[int, int] = {}
    for ev in embeds:
        for i, (row, tid) in enumerate(zip(array(ev["rows"]), ev["token_ids"])):
            by_pos[ev["start"] + i] = row
            ids[ev["start"] + i] = tid
    order = sorted(by_pos)
    if not order:
        return np.zeros((0, 0)), []
    return np.array([by_pos[p] for p in order], dtype=float), [ids[p] for p in order]


def embedding_html(embeds: Sequence[dict], vocab_size: int | None = None, d_model: int | None = None) -> str:
    """vocab_size, d_model: the model's, named before any row is captured."""
    if not embeds:
        table = (f": each token will select one row of the [{vocab_size:,} × {d_model:,}] embedding matrix"
                 if vocab_size and d_model else "")
        return panel("Embedding", empty(f"no embedding rows yet{table} (capture level 'full' records them)"))
    mat, ids = embedding_matrix(embeds)
    d_model = embeds[-1]["shape"][1]
    scale = float(np.abs(mat).max()) or 1.0
    rgb = colormap(mat / scale, diverging=True)
    n, dims = mat.shape
    cell_w = max(1, 640 // dims)
    row_h = max(2, min(8, 480 // n))  # every token row stays visible, however many there are
    title = f"embedding rows: {n} tokens x {dims} dims (of {d_model})"
    info = (f"<div class='tt-lines'><div>shape <b>[{n} tokens × d_model {d_model:,}]</b>"
            f"{'' if dims == d_model else f' · showing the first {dims} of {d_model:,} dims'}"
            f" · values in [{fixed(mat.min(), 3)}, {fixed(mat.max(), 3)}] · colour: blue − / red + "
            f"(±{scale:.3f})</div><div>first ids: {esc(', '.join(map(str, ids[:16])))}"
            f"{'…' if len(ids) > 16 else ''}</div></div>")
    positions = sorted({ev["start"] + i for ev in embeds for i in range(len(ev["token_ids"]))})
    hover = hover_attr({"w": dims, "h": n, "rows": [f"{p} (id {t})" for p, t in zip(positions, ids)],
                        "fmt": "token {r} · dim {c} · value {v}", "ctx": f"embedding row (of d_model {d_model:,})"},
                       mat, signed=True)
    img = hover_img(rgb, "tt-heat tt-embed", title, hover, dims * cell_w, n * row_h)
    return panel("Embedding", info + f'<div class="tt-strip">{img}</div>')
