"""Stage 5a: attention probabilities per layer and head.

Rows are query positions, columns key positions. The prefill matrix comes first;
each decode (or speculative verify) step adds its new row(s) underneath. Cells above
the diagonal are the causal mask; cells older than a sliding window are that mask
(Gemma 3 mixes local, sliding-window layers with global ones: the panel says which).
Query heads are drawn grouped by the KV head they share (grouped-query attention).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from visualizers.compact import per_layer
from visualizers._html import (MASKED, OUTSIDE_WINDOW, colormap, empty, esc, hover_attr, hover_img, panel,
                               show_piece)

MAX_POSITIONS = 96  # the newest positions shown
THUMB_POSITIONS = 32
THUMB_PX = 96  # the widest a thumbnail may be (2 px a position for 32 positions)
KIND_RGB = {"prefill": (70, 110, 200), "decode": (240, 140, 30), "verify": (160, 80, 200)}
CAUSAL_RGB = np.array([30, 30, 36], dtype=np.uint8)
WINDOW_RGB = np.array([120, 40, 50], dtype=np.uint8)
UNSEEN_RGB = np.array([200, 200, 205], dtype=np.uint8)
PICKED_RGB = np.array([220, 20, 60], dtype=np.uint8)  # the gutter of the row picked in the Tokens panel


def layers_and_heads(events: Sequence[dict]) -> tuple[list[int], list[int]]:
    events = per_layer(events)
    layers = sorted({e["layer"] for e in events})
    heads = list(events[0]["heads"]) if events else []
    return layers, heads


def attention_matrix(events: Sequence[dict], layer: int, head: int, max_positions: int = MAX_POSITIONS
                     ) -> tuple[np.ndarray, np.ndarray, list[str | None], int, int | None]:
    """-> (probs [R, C] with NaN where not captured, mask codes [R, C] (0 visible, 1 causal,
    2 outside the window), kind of each row, first position, window)."""
    evs = [e for e in per_layer(events) if e["layer"] == layer]
    if not evs:
        return np.zeros((0, 0)), np.zeros((0, 0), dtype=int), [], 0, None
    hi = max(e["q_start"] + len(e["probs"][0]) for e in evs)
    lo = max(0, hi - max_positions)
    n = hi - lo
    probs = np.full((n, n), np.nan)
    kinds: list[str | None] = [None] * n
    window = evs[-1].get("window")
    for e in evs:
        h = e["heads"].index(head) if head in e["heads"] else None
        if h is None:
            continue
        rows = np.asarray(e["probs"][h], dtype=float)
        for r, row in enumerate(rows):
            q = e["q_start"] + r
            if q < lo:
                continue
            kinds[q - lo] = e["kind"]
            k0 = e["k_start"]
            cols = np.arange(k0, k0 + len(row))
            keep = cols >= lo
            probs[q - lo, cols[keep] - lo] = row[keep]
    q = np.arange(lo, hi)[:, None]
    k = np.arange(lo, hi)[None, :]
    mask = np.where(k > q, 1, 0)
    if window:
        mask = np.where((k <= q) & (q - k >= window), 2, mask)
    return probs, mask, kinds, lo, window


def layer_spans(layers: Sequence[int]) -> str:
    """[0, 1, 2, 4] -> "0–2, 4"."""
    out, start = [], None
    for i, x in enumerate(layers):
        if start is None:
            start = x
        if i + 1 == len(layers) or layers[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}–{x}")
            start = None
    return ", ".join(out)


def layer_kinds(sliding_windows: Sequence[int | None]) -> str:
    """Which layers are local (a sliding window of N tokens) and which global, e.g.
    "local (sliding window 512 tokens): layers 0–4, 6–10 · global (full attention): layers 5, 11"."""
    parts = []
    for w in sorted({w for w in sliding_windows if w}):
        idx = [i for i, x in enumerate(sliding_windows) if x == w]
        parts.append(f"local (sliding window {w} tokens): layer{'s' if len(idx) > 1 else ''} {layer_spans(idx)}")
    full = [i for i, x in enumerate(sliding_windows) if not x]
    if full:
        parts.append(f"global (full attention): layer{'s' if len(full) > 1 else ''} {layer_spans(full)}")
    return esc(" · ".join(parts))


def _image(probs: np.ndarray, mask: np.ndarray, kinds: list[str | None]) -> np.ndarray:
    # sqrt stretches small probabilities so structure beyond the top key shows
    rgb = colormap(np.sqrt(np.nan_to_num(probs, nan=0.0)))
    rgb[np.isnan(probs)] = UNSEEN_RGB
    rgb[mask == 1] = CAUSAL_RGB
    rgb[mask == 2] = WINDOW_RGB
    gutter = np.zeros((len(kinds), 2, 3), dtype=np.uint8) + 255
    for i, kind in enumerate(kinds):
        if kind:
            gutter[i, :] = KIND_RGB.get(kind, (0, 0, 0))
    return np.concatenate([gutter, rgb], axis=1)


def _hover(probs: np.ndarray, mask: np.ndarray, kinds: list[str | None], lo: int, labels: Sequence[str],
           ctx: str) -> str:
    """Each cell under the pointer: query token -> key token, its weight, the layer and head."""
    names = [f"{lo + i} {labels[lo + i]!r}" if lo + i < len(labels) else str(lo + i) for i in range(len(kinds))]
    spec = {"w": len(kinds) + 2, "h": len(kinds), "x0": 2, "rows": names, "same": True, "row_name": "query",
            "gutter": [k or "" for k in kinds], "fmt": "query {r} → key {c} · weight {v}", "ctx": ctx,
            "codes": [(MASKED, mask == 1), (OUTSIDE_WINDOW, mask == 2)]}
    return hover_attr(spec, probs)


def _scaled(rgb: np.ndarray, width: int) -> tuple[int, int]:
    h, w, _ = rgb.shape
    cell = max(1, width // max(w, 1))
    return w * cell, h * cell


def attention_html(events: Sequence[dict], layer: int | None = None, head: int | None = None,
                   labels: Sequence[str] = (), sliding_windows: Sequence[int | None] | None = None,
                   position: int | None = None) -> str:
    """events: this request's `attention` events. labels: token text by position. position: the
    query row picked in the Tokens panel (marked in the gutter and put in words; default: the newest)."""
    if not events:
        return panel("Attention", empty("no attention captured yet (capture level 'full' records it)"))
    events = per_layer(events)  # one event per layer (the engine's hold every layer of a pass)
    layers, heads = layers_and_heads(events)
    layer = layer if layer in layers else layers[0]
    head = head if head in heads else heads[0]
    last = next(e for e in reversed(events) if e["layer"] == layer)
    num_heads, num_kv = last["num_heads"], last["num_kv_heads"]
    group = num_heads // num_kv
    probs, mask, kinds, lo, window = attention_matrix(events, layer, head)
    rgb = _image(probs, mask, kinds)
    rows_seen = np.where(~np.all(np.isnan(probs), axis=1))[0]
    picked = position is not None and position - lo in set(rows_seen.tolist())
    if picked:
        rgb[position - lo, :2] = PICKED_RGB
    w, h = _scaled(rgb, 480)
    ctx = f"layer {layer} · head {head} (KV head {head // group})"
    big = hover_img(rgb, "tt-heat", f"{ctx}: rows are queries from position {lo}",
                    _hover(probs, mask, kinds, lo, labels, ctx), w, h)

    # Grouped-query structure: query heads boxed by the KV head they read.
    groups = []
    for kv in range(num_kv):
        thumbs = []
        for qh in range(kv * group, (kv + 1) * group):
            if qh not in heads:
                continue
            p, m, k, lo_t, _ = attention_matrix(events, layer, qh, THUMB_POSITIONS)
            img = _image(p, m, k)
            tw, th = _scaled(img, THUMB_PX)
            sel = " tt-sel" if qh == head else ""
            thumbs.append(f'<figure class="tt-thumb{sel}">'
                          + hover_img(img, "tt-heat", f"query head {qh} (KV head {kv})",
                                      _hover(p, m, k, lo_t, labels, f"layer {layer} · head {qh} (KV head {kv})"),
                                      tw, th)
                          + f"<figcaption>Q{qh}</figcaption></figure>")
        groups.append(f'<div class="tt-group"><div class="tt-group-title">KV head {kv} ← query heads '
                      f'{kv * group}–{(kv + 1) * group - 1}</div>{"".join(thumbs)}</div>')

    # The newest row in words: which keys it attended to most.
    newest = ""
    if len(rows_seen):
        r = position - lo if picked else rows_seen[-1]
        row = np.nan_to_num(probs[r], nan=0.0)
        top = np.argsort(row)[::-1][:5]
        def lab(pos: int) -> str:
            return show_piece(labels[pos]) if pos < len(labels) else f"#{pos}"
        newest = (f"<div>{'picked' if picked else 'newest'} row: position {lo + r} ({esc(kinds[r] or '')}, token "
                  f"<code>{lab(lo + r)}</code>) attends most to "
                  + ", ".join(f"<code>{lab(lo + int(c))}</code>@{lo + int(c)} {row[c]:.2f}" for c in top if row[c] > 0)
                  + "</div>")
    if sliding_windows and layer < len(sliding_windows):
        window = sliding_windows[layer]
    mixed = bool(sliding_windows) and any(sliding_windows) and not all(sliding_windows)
    if window:
        win_text = (f"{'local layer: ' if mixed else ''}sliding window {window} tokens, each query sees only the "
                    f"last {window} (dark red: masked as too old)")
    else:
        win_text = "global layer: full causal attention, every earlier token" if mixed else "full causal attention"
    if sliding_windows:
        win_text += " · " + layer_kinds(sliding_windows)
    n_rows = {k: sum(1 for x in kinds if x == k) for k in ("prefill", "decode", "verify")}
    info = (f"<div class='tt-lines'><div>layer <b>{layer}</b> of {len(layers)} captured · query head <b>{head}</b> · "
            f"{num_heads} query heads share {num_kv} KV heads ({group} per KV head) · {win_text}</div>"
            f"<div>rows: {n_rows['prefill']} prefill, {n_rows['decode']} decode, {n_rows['verify']} verify · "
            f"positions {lo}–{lo + len(kinds) - 1} · left gutter: <span class='tt-k-prefill'>prefill</span> "
            f"<span class='tt-k-decode'>decode</span> <span class='tt-k-verify'>verify</span> · "
            f"black: causal mask · grey: not captured</div>{newest}</div>")
    return panel("Attention", info + f'<div class="tt-attn"><div class="tt-attn-big">{big}</div>'
                 f'<div class="tt-groups">{"".join(groups)}</div></div>')
