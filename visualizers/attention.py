"""Stage 5a: attention probabilities per layer and head, for the selected pass.

The map: rows are query positions, columns key positions, both labelled with their tokens
(shortened; the full text on hover). It ends at the selected pass's query (its row at the
bottom, outlined). Its columns are the keys that pass's capture kept: the first few positions
(the attention sink, the prompt's start), a marked gap of the keys between them that were not
captured ("⋯ 8–17"), then the most recent ones; a trace without first keys shows its older
keys as one band ("… 412 earlier keys not captured"), never cut silently. Cells above the
diagonal are the causal mask; cells older than a sliding window are that mask (Gemma 3 mixes
local, sliding-window layers with global ones: the panel says which).

Beside it, the overview (BertViz's model view): the selected query's row in every captured
layer and head, query heads grouped by the KV head they share (grouped-query attention);
a click on a cell opens that layer and head (overview_html).
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from visualizers import i18n
from visualizers._html import (MASKED, OUTSIDE_WINDOW, bold, colormap, empty, esc, hover_attr, hover_img,
                              said_html, said_html_n, show_piece)
from visualizers.attention_overview import overview_html
from visualizers.attention_rows import LayerIndex, key_positions
from visualizers.char_runs import label_html, label_title
from visualizers.selection import Selection, header_html

MAX_POSITIONS = 64  # the map's rows and columns: the capture's default key budget (--capture-max-keys)
MAP_PX = 480  # the map's width on a wide screen (cells of MIN_CELL to 16 px)
MIN_CELL = 9  # px: a row's label is a pixel smaller; at 7 px (64 rows) the token labels could not be read
LABEL_CHARS = 6  # a label's characters before it is shortened with "…"
KIND_RGB = {"prefill": (70, 110, 200), "decode": (240, 140, 30), "verify": (160, 80, 200)}
CAUSAL_RGB = np.array([30, 30, 36], dtype=np.uint8)
WINDOW_RGB = np.array([120, 40, 50], dtype=np.uint8)
UNSEEN_RGB = np.array([200, 200, 205], dtype=np.uint8)
GAP_RGB = (np.array([236, 226, 198], dtype=np.uint8), np.array([214, 200, 160], dtype=np.uint8))  # striped
GAP_COLS = 2  # the gap's width in cells: keys between the first ones and the recent ones


def layers_and_heads(events: Sequence[dict], index: LayerIndex | None = None) -> tuple[list[int], list[int]]:
    index = index or LayerIndex(events)
    return index.layers, index.heads


def key_columns(index: LayerIndex, layer: int, head: int, lo: int, hi: int, cols: np.ndarray
                ) -> tuple[np.ndarray, list[str | None]]:
    """The weights of the queries lo .. hi - 1 at the key positions `cols` (NaN: not captured)
    -> (probs [hi - lo, len(cols)], kind of each row)."""
    n = hi - lo
    probs = np.full((n, len(cols)), np.nan)
    kinds: list[str | None] = [None] * n
    where = {int(c): i for i, c in enumerate(cols)}
    for lp in index.passes_between(layer, lo, hi):  # oldest first: a recomputed row (a verify after a rejection) overwrites
        if head not in lp.heads:
            continue
        rows = index.probs(lp)[lp.heads.index(head)]
        for r, row in enumerate(rows):
            q = lp.q_start + r
            if not lo <= q < hi:
                continue
            kinds[q - lo] = lp.kind
            probs[q - lo] = np.nan
            for c, w in zip(key_positions(lp.k_head, lp.k_start, len(row)), np.asarray(row, dtype=float)):
                if (i := where.get(int(c))) is not None:
                    probs[q - lo, i] = w
    return probs, kinds


def masks(lo: int, hi: int, cols: np.ndarray, window: int | None) -> np.ndarray:
    """Mask codes [hi - lo, len(cols)]: 0 visible, 1 causal (a later key), 2 outside the window."""
    q = np.arange(lo, hi)[:, None]
    k = np.asarray(cols)[None, :]
    mask = np.where(k > q, 1, 0)
    if window:
        mask = np.where((k <= q) & (q - k >= window), 2, mask)
    return mask


def attention_matrix(events: Sequence[dict], layer: int, head: int, max_positions: int = MAX_POSITIONS,
                     end: int | None = None, index: LayerIndex | None = None
                     ) -> tuple[np.ndarray, np.ndarray, list[str | None], int, int | None]:
    """The positions lo .. end (default: the newest captured query) of one layer and head ->
    (probs [R, C] with NaN where not captured, mask codes [R, C] (0 visible, 1 causal, 2
    outside the window), kind of each row, lo, window)."""
    index = index or LayerIndex(events)
    first, last = index.span(layer)
    if last == 0:
        return np.zeros((0, 0)), np.zeros((0, 0), dtype=int), [], 0, None
    hi = last if end is None else end + 1
    lo = max(0, hi - max_positions)
    lps = index.passes_between(layer, lo, hi)
    window = (lps[-1] if lps else index.of(layer)[-1]).window
    cols = np.arange(lo, hi)
    probs, kinds = key_columns(index, layer, head, lo, hi, cols)
    return probs, masks(lo, hi, cols, window), kinds, lo, window


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


def layer_kinds(sliding_windows: Sequence[int | None], lang: str = i18n.DEFAULT) -> str:
    """Which layers are local (a sliding window of N tokens) and which global, e.g.
    "local (sliding window 512 tokens): layers 0–4, 6–10 · global (full attention): layers 5, 11"."""
    parts = []
    for w in sorted({w for w in sliding_windows if w}):
        idx = [i for i, x in enumerate(sliding_windows) if x == w]
        parts.append(i18n.ngettext(lang, "local (sliding window {w} tokens): layer {layers}",
                                   "local (sliding window {w} tokens): layers {layers}", len(idx), w=str(w),
                                   layers=layer_spans(idx)))
    full = [i for i, x in enumerate(sliding_windows) if not x]
    if full:
        parts.append(i18n.ngettext(lang, "global (full attention): layer {layers}",
                                   "global (full attention): layers {layers}", len(full), layers=layer_spans(full)))
    return esc(" · ".join(parts))


def image(probs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    # sqrt stretches small probabilities so structure beyond the top key shows
    rgb = colormap(np.sqrt(np.nan_to_num(probs, nan=0.0)))
    rgb[np.isnan(probs)] = UNSEEN_RGB
    rgb[mask == 1] = CAUSAL_RGB
    rgb[mask == 2] = WINDOW_RGB
    return rgb


def short(text: str) -> str:
    """A label as a chip shows it (show_piece), cut to LABEL_CHARS characters (escaped)."""
    return show_piece(text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "…")  # cut, then escape


def label_of(labels: Sequence[str], pos: int) -> str:
    return labels[pos] if 0 <= pos < len(labels) else f"#{pos}"


def _short_at(labels: Sequence[str], pos: int) -> str:
    """Position pos's label, shortened, a piece of a split character drawn as that character (dashed)."""
    return label_html(labels, pos, LABEL_CHARS) if 0 <= pos < len(labels) else short(f"#{pos}")


def _piece_at(labels: Sequence[str], pos: int) -> str:
    return label_html(labels, pos) if 0 <= pos < len(labels) else show_piece(f"#{pos}")


def _title_at(labels: Sequence[str], pos: int, lang: str = i18n.DEFAULT) -> str:
    more = label_title(labels, pos, lang=lang) if 0 <= pos < len(labels) and "<0x" in labels[pos] else ""
    return _said(lang, i18n.N_("position {p}: {token}")).format(p=pos, token=repr(label_of(labels, pos))) \
        + (f" · {more}" if more else "")


@functools.cache
def _said(lang: str, msgid: str) -> str:
    """A catalog text of a label drawn once per row and column, looked up once (filled by the caller)."""
    return i18n.gettext(lang, msgid)


def _axis(labels: Sequence[str], lo: int, n: int, kinds: list[str | None], picked: int | None,
          cols: Sequence[int], gap: tuple[int, int], lang: str = i18n.DEFAULT) -> tuple[str, str]:
    """The map's row labels (query: position and token, the row's kind as its left edge) and
    column labels (keys at their true positions; -1: a column of the gap, keys gap[0] ..
    gap[1] - 1, one label for them all); each names its full token on hover, and a click on
    one selects its pass."""
    rows, heads = [], []
    for i in range(n):
        pos = lo + i
        kind = kinds[i] or "none"
        title = esc(_said(lang, i18n.N_("query {what} ({kind})")).format(what=_title_at(labels, pos, lang),
                                                                 kind=_said(lang, kinds[i] or "not captured")))
        sel = " tt-amap-picked" if pos == picked else ""
        rows.append(f'<span class="tt-amap-r tt-k-{kind}{sel}" data-pos="{pos}" title="{title}">'
                    f"{_short_at(labels, pos)}<i>{pos}</i></span>")
    gap_done = False
    for pos in cols:
        if pos < 0:
            if not gap_done:
                first, last = gap[0], gap[1] - 1
                gap_title = esc(i18n.gettext(lang, "keys {first}–{last}: not captured (the capture keeps the first keys "
                                                   "and the most recent ones)", first=str(first), last=str(last)))
                heads.append(f'<span class="tt-amap-c tt-amap-gap" style="--span:{GAP_COLS}" title="{gap_title}">'
                             f"⋯{first}–{last}</span>")
                gap_done = True
            continue
        title = esc(_said(lang, i18n.N_("key {what}")).format(what=_title_at(labels, pos, lang)))
        heads.append(f'<span class="tt-amap-c" data-pos="{pos}" title="{title}">{_short_at(labels, pos)}'
                     "</span>")
    return "".join(rows), "".join(heads)


def _map_columns(end_row, lo: int) -> np.ndarray:
    """The map's key columns, true positions: the end row's first keys, the gap (-1), then lo on."""
    gap = end_row.gap if end_row is not None else None
    if gap is None or gap[0] >= lo:
        return np.zeros(0, dtype=int)
    return np.array(list(range(gap[0])) + [-1] * GAP_COLS, dtype=int)


def map_html(index: LayerIndex, layer: int, head: int, group: int, labels: Sequence[str],
             end: int | None, lang: str = i18n.DEFAULT) -> tuple[str, dict]:
    """The labelled map ending at query `end` (None: the newest) -> (HTML, what it drew:
    lo, hi, the end row's Row, the band's count, the kept first keys)."""
    first, last = index.span(layer)
    hi = last if end is None else end + 1
    end_row = index.row(layer, head, hi - 1)
    k0 = end_row.k_start if end_row is not None else max(0, hi - MAX_POSITIONS)
    k_head = end_row.gap[0] if end_row is not None and end_row.gap else 0
    span = max(1, min(MAX_POSITIONS - k_head, hi - k0))
    probs, mask, kinds, lo, window = attention_matrix([], layer, head, span, hi - 1, index)
    n = len(kinds)
    lead = _map_columns(end_row, lo)  # the first keys and the gap, before the recent ones
    cols = np.concatenate([lead, np.arange(lo, hi)]).astype(int)
    if len(lead):
        real = lead[lead >= 0]
        head_probs, _ = key_columns(index, layer, head, lo, hi, real)
        probs = np.concatenate([head_probs, np.full((n, GAP_COLS), np.nan), probs], axis=1)
        mask = np.concatenate([masks(lo, hi, real, window), np.zeros((n, GAP_COLS), dtype=int), mask], axis=1)
    rgb = image(probs, mask)
    gap_cols = cols < 0
    for r in range(n):  # the gap striped, not the grey of a key that was not captured
        rgb[r, gap_cols] = GAP_RGB[r % 2]
    nc = len(cols)
    cell = max(MIN_CELL, min(16, MAP_PX // max(nc, 1)))
    ctx = i18n.gettext(lang, "layer {layer} · head {head} (KV head {kv})", layer=str(layer), head=str(head),
                       kv=str(head // group))
    names = [f"{lo + i} {label_of(labels, lo + i)!r}" for i in range(n)]
    gap_name = i18n.gettext(lang, "{first}–{last} (the gap: not captured)", first=str(k_head), last=str(lo - 1))
    col_names = [gap_name if c < 0 else f"{c} {label_of(labels, int(c))!r}" for c in cols]
    spec = {"w": nc, "h": n, "x0": 0, "rows": names, "cols": col_names, "row_name": i18n.gettext(lang, "query"),
            "fmt": i18n.gettext(lang, "query {r} → key {c} · weight {v}"), "ctx": ctx,
            "code_words": {65535: i18n.gettext(lang, "not captured"),  # hover.js's CODES, in lang
                           65534: i18n.gettext(lang, "masked (causal: a later key)"),
                           65533: i18n.gettext(lang, "masked (outside the sliding window)")},
            "codes": [(MASKED, mask == 1), (OUTSIDE_WINDOW, mask == 2)]}
    keys_said = (i18n.gettext(lang, "keys 0–{k}, {lo}–{hi}", k=str(k_head - 1), lo=str(lo), hi=str(hi - 1)) if len(lead)
                 else i18n.gettext(lang, "keys {lo}–{hi}", lo=str(lo), hi=str(hi - 1)))
    alt = i18n.gettext(lang, "{ctx}: queries {lo}–{hi} × {keys}", ctx=ctx, lo=str(lo), hi=str(hi - 1), keys=keys_said)
    img = hover_img(rgb, "tt-heat tt-amap-img", alt, hover_attr(spec, probs), nc * cell, n * cell)
    row_labels, col_labels = _axis(labels, lo, n, kinds, hi - 1 if end_row is not None else None, cols, (k_head, lo),
                                   lang)
    band = _band(lo, k0, lang) if lo > 0 and not len(lead) else ""
    corner = said_html(lang, "query ↓") + "<br>" + said_html(lang, "key →")
    grid = (f'<div class="tt-amap{" tt-amap-banded" if band else ""}" style="--n:{n};--nc:{nc};--cell-w:{cell}px">'
            f'<div class="tt-amap-corner">{corner}</div>{"<div></div>" if band else ""}'
            f'<div class="tt-amap-cols">{col_labels}</div><div class="tt-amap-rows">{row_labels}</div>{band}'
            f'<div class="tt-amap-body">{img}</div></div>')
    return grid, {"lo": lo, "hi": hi, "row": end_row, "band": lo, "kinds": kinds, "first": k_head if len(lead) else 0,
                  "cols": cols}


def _band(lo: int, k0: int, lang: str) -> str:
    """The band over the map that stands for the earlier keys it does not draw."""
    num = i18n.number
    words = (i18n.gettext(lang, "{n} earlier keys not captured", n=num(lang, lo)) if lo <= k0 else
             i18n.gettext(lang, "{n} earlier keys: {drawn} captured, not drawn; {missed} not captured", n=num(lang, lo),
                          drawn=num(lang, lo - k0), missed=num(lang, k0)))
    title = i18n.gettext(lang, "keys 0–{last}: {what} (the capture keeps the last keys of every row: "
                               "--capture-max-keys)", last=str(lo - 1), what=words)
    return f'<div class="tt-amap-band" title="{esc(title)}"><span>… {esc(words)}</span></div>'


def _top_keys(row, labels: Sequence[str]) -> str:
    """The keys one query attended to most, in words (HTML)."""
    top = np.argsort(row.weights)[::-1][:5]
    pos = row.positions
    return ", ".join(f"<code>{_piece_at(labels, int(pos[c]))}</code>@{int(pos[c])} "
                     f"{row.weights[c]:.2f}" for c in top if row.weights[c] > 0)


def _window_words(window: int | None, sliding_windows: Sequence[int | None] | None, lang: str = i18n.DEFAULT) -> str:
    mixed = bool(sliding_windows) and any(sliding_windows) and not all(sliding_windows)
    if window:
        text = (i18n.gettext(lang, "local layer: sliding window {w} tokens, each query sees only the last {w} (dark red: "
                                   "masked as too old)", w=str(window)) if mixed else
                i18n.gettext(lang, "sliding window {w} tokens, each query sees only the last {w} (dark red: masked as "
                                   "too old)", w=str(window)))
    else:
        text = i18n.gettext(lang, "global layer: full causal attention, every earlier token") if mixed else \
            i18n.gettext(lang, "full causal attention")
    return esc(text) + (" · " + layer_kinds(sliding_windows, lang) if sliding_windows else "")


def attention_html(events: Sequence[dict], layer: int | None = None, head: int | None = None,
                   labels: Sequence[str] = (), sliding_windows: Sequence[int | None] | None = None,
                   position: int | None = None, selection: Selection | None = None, frozen: str = "",
                   lang: str = i18n.DEFAULT) -> str:
    """events: this request's `attention` events. labels: token text by position. position:
    the query row to show (default: the selection's pass, else the newest captured row).
    frozen: the header's warning when the trace's byte cap stopped these captures."""
    if not events:
        return ('<div class="tt-panel">' + header_html(i18n.N_("Attention"), None, frozen, lang=lang)
                + empty(i18n.gettext(lang, "no attention captured yet (capture level 'full' records it)")) + "</div>")
    index = LayerIndex(events)
    layers, heads = layers_and_heads(events, index)
    layer = layer if layer in layers else layers[0]
    head = head if head in heads else heads[0]
    last = index.of(layer)[-1]
    if position is None and selection is not None:
        position = selection.read
    first, newest = index.span(layer)
    end = position if position is not None and position < newest else None
    group = max(1, last.num_heads // last.num_kv_heads)
    grid, drawn = map_html(index, layer, head, group, labels, end, lang)
    row, hi = drawn["row"], drawn["hi"]
    window = sliding_windows[layer] if sliding_windows and layer < len(sliding_windows) else last.window
    if row is not None:
        said = "<div>" + said_html(lang, "query row: position {p} ({kind}, token {token}) attends most to {top}",
                                   p=str(hi - 1), kind=esc(i18n.gettext(lang, row.kind)),
                                   token="<code>" + _piece_at(labels, hi - 1) + "</code>", top=_top_keys(row, labels)) \
            + "</div>"
    else:
        said = "<div class='tt-note'>" + said_html(
            lang, "position {p} has no captured row at layer {layer} (the capture keeps the last rows of a long "
                  "prompt; this layer holds queries {first}–{last})", p=str(hi - 1), layer=str(layer),
            first=str(first), last=str(newest - 1)) + "</div>"
    if selection is not None and selection.read is not None and selection.read != hi - 1:
        said += "<div class='tt-note'>" + said_html(
            lang, "the selected pass read position {p}: no attention was captured for it, so the map shows the newest "
                  "captured row", p=str(selection.read)) + "</div>"
    info = _info(layer, layers, head, last, window, sliding_windows, drawn, lang) + said + "</div>"
    over = overview_html(index, layers, heads, last.num_kv_heads, hi - 1, labels, sliding_windows, (layer, head), lang)
    return ('<div class="tt-panel">' + header_html(i18n.N_("Attention"), selection, frozen, lang=lang) + info
            + f'<div class="tt-attn"><div class="tt-attn-big">{grid}</div>{over}</div></div>')


ROW_KINDS = (i18n.N_("prefill"), i18n.N_("decode"), i18n.N_("verify"), i18n.N_("not captured"))  # shown in the lang


def _info(layer: int, layers: Sequence[int], head: int, last, window: int | None,
          sliding_windows: Sequence[int | None] | None, drawn: dict, lang: str) -> str:
    """The lines over the map: the layer and head, how heads share KV heads, the window, the rows
    drawn and the key columns (HTML, its <div class='tt-lines'> left open for the query's line)."""
    num_heads, num_kv = last.num_heads, last.num_kv_heads
    group = max(1, num_heads // num_kv)
    kinds, k_head, lo, hi = drawn["kinds"], drawn["first"], drawn["lo"], drawn["hi"]
    gap = said_html(lang, " · keys: the first {k} (0–{k_last}: the attention sink, the prompt's start), then {mark} "
                          "the gap {k}–{gap_last} (striped: not captured), then the newest {newest} ({lo}–{hi})",
                    k=str(k_head), k_last=str(k_head - 1), mark="<span class='tt-amap-gapkey'>⋯</span>",
                    gap_last=str(lo - 1), newest=str(hi - lo), lo=str(lo), hi=str(hi - 1)) if k_head else ""
    n_rows = {k: sum(1 for x in kinds if x == k) for k in ("prefill", "decode", "verify")}
    # verify rows only where a draft's proposals were checked: a request with no draft has none to name
    verify = said_html(lang, ", {n} verify", n=str(n_rows["verify"])) if n_rows["verify"] else ""
    key = {k: f"<span class='tt-k-{k}'>{said_html(lang, k)}</span>" for k in ("prefill", "decode", "verify")}
    first = said_html(lang, "layer {layer} of {layers} captured · query head {head} · {heads} share {kv_heads} ({group} "
                            "per KV head) · {window}", layer=bold(layer), layers=str(len(layers)),
                      head=bold(head), heads=said_html_n(lang, "{n} query head", "{n} query heads", num_heads),
                      kv_heads=said_html_n(lang, "{n} KV head", "{n} KV heads", num_kv), group=str(group),
                      window=_window_words(window, sliding_windows, lang))
    second = said_html(lang, "rows drawn: {prefill} prefill, {decode} decode{verify} · positions {lo}–{hi}{gap} · row "
                             "edge: {key_prefill} {key_decode}{key_verify} · black: causal mask · grey: not captured (a "
                             "prompt row the prefix cache served was computed by an earlier request; a long prompt "
                             "keeps its last rows)", prefill=str(n_rows["prefill"]), decode=str(n_rows["decode"]),
                       verify=verify, lo=str(lo), hi=str(hi - 1), gap=gap, key_prefill=key["prefill"],
                       key_decode=key["decode"], key_verify=(" " + key["verify"]) if n_rows["verify"] else "")
    return f"<div class='tt-lines'><div>{first}</div><div>{second}</div>"
