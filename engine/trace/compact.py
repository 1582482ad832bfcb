"""The compact form of a trace's big tensor captures: attention probabilities and embedding
rows, the two things the page draws as heatmaps (most of a `full` trace's bytes).

A capture becomes a small dict {"enc", "shape", "data"}: the values quantized to one byte
(or half floats), zlib-deflated, base64 text (JSON-safe). visualizers/compact.py reads it
back (`dense`, `array`); values the page prints exactly (the logit lens, sampling) are
never stored this way.

Attention ("p8"): a probability p becomes the index of its nearest level in LEVELS (255
levels in [0, 1]). The page colours sqrt(p) (visualizers/attention.py), so the levels step
1/63 in sqrt(p) where p is small, and at most 0.004 in p where it is large: the picture
differs from the exact one by at most 1.6 CIE76 dE (below the ~2.3 a viewer can tell) and
a printed weight by at most 0.002. The codes are Huffman-coded (deflate without LZ77
matches, which only cost here). Measured on SmolLM2 decode steps (30 layers x 9 heads x
64 keys; `python -m benchmarks.trace_bytes --encodings`): 9.6 KB a step, against 110 KB
as 4-decimal JSON, 13.8 KB as 8-bit sqrt(p) and 12.0 KB as 7-bit sqrt(p) (the nearest
picture-equal ones), 9.5 KB as 6-bit sqrt(p) (dE 2.7, weights off by up to 0.016) and
6.2 KB as 8-bit p, whose picture loses the small weights (dE 4.9). Coding a step against
the one before gains under 0.3 bits a value: not worth a reader that needs the step before.

Embedding rows ("f16"): half floats (3 significant digits; the page prints 3 decimals).
"""
from __future__ import annotations

import base64
import zlib

import numpy as np
import torch

ATTENTION = "p8"  # the attention probabilities' encoding
ROWS = "f16"  # the embedding rows'
SQRT_STEP, P_STEP = 1 / 63, 0.004
ZLIB_LEVEL = 6


def probability_levels() -> np.ndarray:
    """The 255 levels of "p8" (visualizers/compact.py builds the same table: a test holds it)."""
    out = [0.0]
    while out[-1] < 1.0:
        p = out[-1]
        out.append(min((p ** 0.5 + SQRT_STEP) ** 2, p + P_STEP))
    out[-1] = 1.0
    return np.array(out)


LEVELS = probability_levels()
assert len(LEVELS) <= 256
# p -> its nearest level's code, looked up at 2^20 points of [0, 1] (0.5e-6 apart): a table
# lookup in numpy is far faster than torch.bucketize or torch indexing on the CPU
_GRID = (1 << 20) - 1
_CODES = np.searchsorted((LEVELS[1:] + LEVELS[:-1]) / 2, np.arange(_GRID + 1) / _GRID).astype(np.uint8)


def _pack(enc: str, shape: list[int], raw: bytes, huffman_only: bool = False) -> dict:
    """huffman_only: the codes of "p8" have no repeats worth LZ77's matches (they cost more in
    the symbol alphabet than they save): Huffman coding alone is smaller and faster."""
    z = zlib.compressobj(ZLIB_LEVEL, zlib.DEFLATED, 15, 9, zlib.Z_HUFFMAN_ONLY if huffman_only else zlib.Z_DEFAULT_STRATEGY)
    return {"enc": enc, "shape": shape, "data": base64.b64encode(z.compress(raw) + z.flush()).decode("ascii")}


def encode_probs(probs: torch.Tensor) -> dict:
    """Probabilities (any shape, values in [0, 1]) -> the compact "p8" form."""
    p = probs.detach().float().cpu().numpy()
    codes = _CODES[np.clip(p * _GRID + 0.5, 0, _GRID).astype(np.intp)]  # the nearest level
    return _pack(ATTENTION, list(p.shape), codes.tobytes(), huffman_only=True)


def encode_rows(rows: torch.Tensor) -> dict:
    """Embedding rows [n, dims] -> the compact "f16" form."""
    r = rows.detach().to(torch.float16).cpu().numpy()
    return _pack(ROWS, list(r.shape), r.astype("<f2").tobytes())


def decode(x: dict) -> np.ndarray:
    """The compact form back as float32 (for tests and tools: the page uses visualizers/compact.py)."""
    raw = zlib.decompress(base64.b64decode(x["data"]))
    if x["enc"] == ATTENTION:
        return LEVELS.astype(np.float32)[np.frombuffer(raw, dtype=np.uint8)].reshape(x["shape"])
    if x["enc"] == ROWS:
        return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(x["shape"])
    raise ValueError(f"unknown capture encoding {x['enc']!r}")
