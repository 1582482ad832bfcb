"""A trace's tensor captures in their stored form, read back as plain nested lists or arrays.

The engine stores its big captures (attention probabilities, embedding rows) compactly
(engine/trace/compact.py writes that form): {"enc", "shape", "data"}, the values quantized
to a byte ("p8": attention) or half floats ("f16": embedding rows), zlib-deflated, base64.
An older trace file, an engine run with CaptureConfig(compact=False), or a small capture
holds nested lists of floats. Every visualizer reads a capture through `dense` (lists) or
`array` (numpy, faster for a heatmap), so both forms draw the same way.

Attention events: the engine emits one per pass per sequence for all its captured layers
("layers", "windows", probs [layers, heads, rows, keys]); an older trace has one per
layer ("layer", "window", probs [heads, rows, keys]). `per_layer` turns either into the
per-layer form.
"""
from __future__ import annotations

import base64
import zlib
from collections import OrderedDict
from typing import Iterable

import numpy as np

SQRT_STEP, P_STEP = 1 / 63, 0.004  # as engine/trace/compact.py: "p8"'s levels
CACHE_ITEMS = 4096  # decoded captures kept (a 500-token trace has ~1,000): redraws decode nothing


def probability_levels() -> np.ndarray:
    """The 255 levels of "p8": steps of 1/63 in sqrt(p) where p is small, at most 0.004 in p."""
    out = [0.0]
    while out[-1] < 1.0:
        p = out[-1]
        out.append(min((p ** 0.5 + SQRT_STEP) ** 2, p + P_STEP))
    out[-1] = 1.0
    return np.array(out)


LEVELS = probability_levels().astype(np.float32)
_cache: OrderedDict[tuple, np.ndarray] = OrderedDict()


def is_compact(x) -> bool:
    return isinstance(x, dict) and "enc" in x and "data" in x


def array(x) -> np.ndarray:
    """A capture as a float32 array, whichever form it was stored in. A compact one is decoded
    once and kept (read-only: it is shared between calls)."""
    if not is_compact(x):
        return np.asarray(x, dtype=np.float32)
    key = (x["enc"], x["data"])
    got = _cache.get(key)
    if got is None:
        got = _decode(x)
        got.flags.writeable = False
        _cache[key] = got
        while len(_cache) > CACHE_ITEMS:
            _cache.popitem(last=False)
    else:
        _cache.move_to_end(key)
    return got


def dense(x) -> list:
    """A capture as nested lists of floats, whichever form it was stored in (values of the
    compact form rounded to 4 decimals, as the engine rounds its list form)."""
    if not is_compact(x):
        return x
    return np.round(array(x).astype(np.float64), 4).tolist()


def _decode(x: dict) -> np.ndarray:
    raw = zlib.decompress(base64.b64decode(x["data"]))
    if x["enc"] == "p8":
        return LEVELS[np.frombuffer(raw, dtype=np.uint8)].reshape(x["shape"])
    if x["enc"] == "f16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(x["shape"])
    raise ValueError(f"unknown capture encoding {x['enc']!r}")


def per_layer(events: Iterable[dict]) -> list[dict]:
    """Attention events in the per-layer form: each with "layer", "window" and "probs"
    [heads, rows, keys] (an array view for a compact capture, else the stored lists)."""
    out = []
    for e in events:
        if "layers" not in e:
            out.append(e)
            continue
        probs = array(e["probs"]) if is_compact(e["probs"]) else e["probs"]
        rest = {k: v for k, v in e.items() if k not in ("layers", "windows", "probs")}
        for i, (layer, window) in enumerate(zip(e["layers"], e["windows"])):
            out.append({**rest, "layer": layer, "window": window, "probs": probs[i]})
    return out


def lens_layers(ev: dict) -> list[dict]:
    """A `logit_lens` event's rows, one per residual-stream point (row 0: the embedding), each
    {"top_ids", "top_probs", "top_texts", "chosen_rank", "chosen_prob"}: from the engine's
    columns ("top_ids" ... and one "texts" table), or an older trace's "layers" as stored."""
    if "layers" in ev:
        return ev["layers"]
    texts = ev.get("texts", {})
    return [{"top_ids": ids, "top_probs": ps, "top_texts": [texts.get(str(t), "") for t in ids],
             "chosen_rank": rank, "chosen_prob": cp}
            for ids, ps, rank, cp in zip(ev["top_ids"], ev["top_probs"], ev["chosen_rank"], ev["chosen_prob"])]
