"""The attention overview (BertViz's model view): one query's row in every captured layer and
head at once. Rows are layers, columns query heads, grouped by the KV head they share; each
cell is that head's weights over the query's captured keys (oldest key left), so a learner sees
at a glance where every head looks. Sliding-window layers are marked "local". A cell answers
the pointer with its top keys; a click opens that layer and head in the map (app/page/hover.js
writes "LAYER:HEAD:NONCE" into the page's hidden #tt-pick-head box)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from visualizers import i18n
from visualizers._html import colormap, esc, hover_attr, hover_img, said_html, show_piece
from visualizers.attention_rows import LayerIndex
from visualizers.char_runs import label_html

CELL_H, GAP = 7, 3  # a layer's strip height; the gap around a cell (room for the selection frame)
FRAME_RGB = np.array([220, 20, 60], dtype=np.uint8)
UNSEEN_RGB = np.array([200, 200, 205], dtype=np.uint8)
WINDOW_RGB = np.array([120, 40, 50], dtype=np.uint8)


def _label(labels: Sequence[str], pos: int) -> str:
    return labels[pos] if 0 <= pos < len(labels) else f"#{pos}"


GAP_CODE = -2  # a column of the gap between the first keys and the recent ones (drawn striped)
GAP_RGB = np.array([222, 208, 168], dtype=np.uint8)


def key_axis(rows: Sequence, q: int) -> np.ndarray:
    """The overview's key columns, true positions: the first keys every capture kept (0 ..
    k_head - 1), one gap column (-1) and then the oldest recent key .. q; without first keys,
    one run from the oldest captured key."""
    rows = [r for r in rows if r is not None]
    k_lo = min(r.k_start for r in rows)
    gaps = [r.gap for r in rows if r.gap]
    head = min(g[0] for g in gaps) if gaps and len(gaps) == len(rows) else 0
    if not head or head >= k_lo:
        return np.arange(min(k_lo, 0 if gaps else k_lo), q + 1)
    return np.concatenate([np.arange(head), [-1], np.arange(k_lo, q + 1)]).astype(int)


def strips(index: LayerIndex, layers: Sequence[int], heads: Sequence[int], q: int, axis: np.ndarray
           ) -> tuple[np.ndarray, list[list[list | None]]]:
    """-> weights [layers, heads, keys of `axis`] (NaN: not captured; -1: outside a sliding
    window; GAP_CODE: the gap), and each cell's top keys as [position, weight, position, weight, ...]
    (None: not captured): hover.js words them, so a 30 x 9 grid sends numbers, not 270 sentences."""
    where = {int(p): i for i, p in enumerate(axis) if p >= 0}
    out = np.full((len(layers), len(heads), len(axis)), np.nan)
    out[:, :, axis < 0] = GAP_CODE
    real = np.clip(axis, 0, None)
    tops: list[list[list | None]] = []
    for li, layer in enumerate(layers):
        line: list[list | None] = []
        for hi, head in enumerate(heads):
            row = index.row(layer, head, q)
            if row is None:
                line.append(None)
                continue
            pos = row.positions
            for p, w in zip(pos, row.weights):
                if (i := where.get(int(p))) is not None:
                    out[li, hi, i] = w
            if row.window:
                out[li, hi, (axis >= 0) & (real <= q - row.window)] = -1
            top = [int(c) for c in np.argsort(row.weights)[::-1][:3] if row.weights[c] > 0]
            line.append([x for c in top for x in (int(pos[c]), round(float(row.weights[c]), 2))])
        tops.append(line)
    return out, tops


def _group_image(w: np.ndarray, kx: int, frame: tuple[int, int] | None) -> np.ndarray:
    """weights [layers, heads, keys] -> one RGB picture, a cell per (layer, head) on a pitch of
    (keys * kx + GAP) x (CELL_H + GAP); frame: the (layer row, head column) outlined."""
    n_l, n_h, n_k = w.shape
    px, py = n_k * kx + GAP, CELL_H + GAP
    img = np.full((n_l * py, n_h * px, 3), 255, dtype=np.uint8)
    v = np.clip(np.nan_to_num(w, nan=0.0), 0, 1)
    top = v.max(axis=2, keepdims=True)
    rgb = colormap(np.sqrt(v / np.where(top > 0, top, 1)))  # each cell against its own largest weight
    rgb[np.isnan(w)] = UNSEEN_RGB
    rgb[w < 0] = WINDOW_RGB
    rgb[w == GAP_CODE] = GAP_RGB
    for li in range(n_l):
        for hi in range(n_h):
            y, x = li * py + 2, hi * px + 2
            img[y:y + CELL_H, x:x + n_k * kx] = np.repeat(rgb[li, hi][None, :, :], kx, axis=1)
    if frame is not None:
        li, hi = frame
        y0, x0, y1, x1 = li * py + 1, hi * px + 1, li * py + 2 + CELL_H, hi * px + 2 + n_k * kx
        img[y0, x0:x1 + 1] = img[y1, x0:x1 + 1] = FRAME_RGB
        img[y0:y1 + 1, x0] = img[y0:y1 + 1, x1] = FRAME_RGB
    return img


def _keys_words(axis: np.ndarray, lang: str = i18n.DEFAULT) -> str:
    """"keys 0–7, ⋯ (the gap: 8–17, not captured), 18–73" or "keys 10–73"."""
    if (axis >= 0).all():
        return i18n.gettext(lang, "keys {lo}–{hi}", lo=str(int(axis[0])), hi=str(int(axis[-1])))
    cut = int(np.argmax(axis < 0))
    return i18n.gettext(lang, "keys 0–{first}, ⋯ (the gap: {gap_lo}–{gap_hi}, not captured, striped), {lo}–{hi}",
                        first=str(int(axis[cut - 1])), gap_lo=str(int(axis[cut - 1]) + 1),
                        gap_hi=str(int(axis[cut + 1]) - 1), lo=str(int(axis[cut + 1])), hi=str(int(axis[-1])))


def overview_html(index: LayerIndex, layers: Sequence[int], heads: Sequence[int], num_kv: int, q: int,
                  labels: Sequence[str], sliding_windows: Sequence[int | None] | None,
                  picked: tuple[int, int], lang: str = i18n.DEFAULT) -> str:
    """Query q's row in every layer and head; picked: the (layer, head) the map shows."""
    rows = [index.row(layer, head, q) for layer in layers for head in heads]
    if not any(r is not None for r in rows):
        return "<div class='tt-ov'><div class='tt-note'>" + said_html(
            lang, "no layer captured query {q}: the overview shows one captured query row in every layer and head",
            q=str(q)) + "</div></div>"
    axis = key_axis(rows, q)
    n_keys = len(axis)
    kx = max(1, min(3, 48 // n_keys))
    num_heads = index.of(layers[0])[-1].num_heads
    group = max(1, num_heads // max(1, num_kv))
    w, tops = strips(index, layers, heads, q, axis)
    names = {str(p): repr(_label(labels, p)) for line in tops for cell in line if cell for p in cell[::2]}
    py = CELL_H + GAP

    def local(layer: int) -> int | None:
        if sliding_windows and layer < len(sliding_windows):
            return sliding_windows[layer]
        return index.of(layer)[-1].window

    def mark(layer: int) -> str:
        w = local(layer)
        title = (i18n.gettext(lang, "layer {l}: local, sliding window {w} tokens", l=str(layer), w=str(w)) if w else
                 i18n.gettext(lang, "layer {l}: global, full attention", l=str(layer)))
        word = " " + said_html(lang, "local") if w else ""
        return f'<span class="{"tt-ov-local" if w else ""}" title="{esc(title)}">L{layer}{word}</span>'
    marks = "".join(mark(layer) for layer in layers)
    layer_col = f'<div class="tt-ov-layers" style="--py:{py}px">{marks}</div>'  # in every group: groups wrap
    blocks = []
    for kv in range(num_kv):
        cols = [i for i, h in enumerate(heads) if h // group == kv]
        if not cols:
            continue
        sub = w[:, cols]
        frame = None
        if picked[0] in layers and picked[1] in [heads[i] for i in cols]:
            frame = (layers.index(picked[0]), [heads[i] for i in cols].index(picked[1]))
        img = _group_image(sub, kx, frame)
        spec = {"kind": "cells", "w": len(cols), "h": len(layers), "layers": list(layers),
                "heads": [heads[i] for i in cols], "kv": kv, "q": q, "qname": repr(_label(labels, q)),
                "local": [local(l) or 0 for l in layers], "top": [[tops[li][i] for i in cols] for li in range(len(layers))],
                "names": names, "ctx": i18n.gettext(lang, "click: open this head"), "words": hover_words(lang)}
        px = n_keys * kx + GAP
        head_names = "".join(f'<span style="width:{px}px">Q{heads[i]}</span>' for i in cols)
        lo_h, hi_h = heads[cols[0]], heads[cols[-1]]
        title = esc(i18n.gettext(lang, "KV head {kv} ← query heads {lo}–{hi}", kv=str(kv), lo=str(lo_h), hi=str(hi_h))
                    if hi_h != lo_h else i18n.gettext(lang, "KV head {kv} ← query head {lo}", kv=str(kv), lo=str(lo_h)))
        alt = i18n.gettext(lang, "KV head {kv}: layers × query heads", kv=str(kv))
        picture = hover_img(img, "tt-heat tt-ov-img", alt, hover_attr(spec), img.shape[1], img.shape[0])
        blocks.append(f'<div class="tt-group"><div class="tt-group-title">{title}</div><div class="tt-ov-body">'
                      f'{layer_col}<div><div class="tt-ov-heads">{head_names}</div>{picture}</div></div></div>')
    token = f"<code>{label_html(labels, q) if 0 <= q < len(labels) else show_piece(f'#{q}')}</code>"
    line = said_html(lang, "every layer and head for query {q} ({token}): each cell is one head's weights over {keys}, "
                           "oldest left, scaled to its own largest; click a cell to open it", q=str(q), token=token,
                     keys=esc(_keys_words(axis, lang)))
    return f"<div class='tt-ov'><div class='tt-subtitle'>{line}</div><div class='tt-ov-grid'>{''.join(blocks)}</div></div>"


def hover_words(lang: str) -> dict[str, str]:
    """The templates the page's hover.js fills for a cell of the overview, in `lang`."""
    return {"head": i18n.gettext(lang, "layer {layer}{local} · query head {head} (KV head {kv}) · query {q} {name}"),
            "local": i18n.gettext(lang, " (local, window {w})"), "none": i18n.gettext(lang, "{head} · not captured"),
            "most": i18n.gettext(lang, "{head} attends most to {keys} · {ctx}")}
