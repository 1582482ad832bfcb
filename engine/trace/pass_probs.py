"""A `full` trace's attention probabilities written by the pass's own attention, where the
CPU runs every layer in one C call (engine/layers/fused.py stack_forward; cpu_attention.c
with a tt_probs): each key's score is the probability's before the softmax, kept while the
key is in cache and normalised once the row's max and sum are known. After the pass,
collect() read every captured layer's keys again from memory (engine/kernels/cpu_probs.c):
on the embedded MoE at batch 1 about a fifth of a step. Here: where each captured row's
probabilities go (PassProbs), and, after the call, the AttentionCapture collect() would
have made of them (its layers, columns and rows, the same numbers to float rounding)."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from operator import is_

import torch

from engine.batch import ForwardBatch
from engine.trace.arena import Arena, Slice
from engine.trace.capture import AttentionCapture, CaptureSpec, PassCapture, key_window

FIELDS = 6  # cpu_layer.h PROBS_FIELDS: offset, layer stride, head stride, columns, k_head, k_start


@dataclass
class SeqProbs:
    """One captured sequence's part of the pass's buffer: [layers, heads, rows, columns] at offset."""
    b: int
    offset: int
    rows: int
    columns: int
    ctx: int
    k_head: int
    k_start: int


@dataclass
class PassProbs:
    layers: list[int]  # the captured layers, in the specs' order (the first dimension of each part)
    heads: int
    out: Slice  # float32, every part one after another
    rows: ctypes.Array  # c_long [T * FIELDS]: where each row of the pass writes (offset -1: not captured)
    at: ctypes.Array  # c_long [L]: each layer's index among `layers`, -1 where none captures it
    seqs: list[SeqProbs]


@dataclass
class Layout:
    """What a pass's shape fixes: its rows' starts and its sequences' capture specs (by identity),
    the captured ones and layers checked, the arrays the call reads. A decode's every step has the
    same shape: the checks and arrays are made once, a step writes only its rows' fields."""
    starts: list[int]
    specs: list  # the pass's CaptureSpec (or None) per sequence, the objects themselves
    captured: list[tuple[int, CaptureSpec]]
    layers: list[int]
    heads: int
    meta: ctypes.Array  # PassProbs.rows
    where: ctypes.Array  # PassProbs.at

    def fits(self, starts: list[int], specs: list) -> bool:
        return self.starts == starts and len(self.specs) == len(specs) and all(map(is_, self.specs, specs))


def _layout(capture: PassCapture, starts: list[int], q_shapes: list[tuple[int, int]]) -> Layout | None:
    specs = [(b, s) for b, s in enumerate(capture.specs) if s is not None and s.attention_layers]
    if not specs:
        return None
    layers = specs[0][1].attention_layers
    if any(s.attention_layers != layers for _, s in specs) or any(not 0 <= i < len(q_shapes) for i in layers) \
            or len({q_shapes[i] for i in layers}) != 1:
        return None
    # ctypes arrays, not tensors: run cold after the pass, a torch op costs several microseconds
    T = starts[-1]
    where = (ctypes.c_long * len(q_shapes))(*([-1] * len(q_shapes)))
    for j, i in enumerate(layers):
        where[i] = j
    meta = (ctypes.c_long * (T * FIELDS))(*([-1] * (T * FIELDS)))
    return Layout(list(starts), list(capture.specs), specs, list(layers), q_shapes[layers[0]][0], meta, where)


def plan(capture: PassCapture, batch: ForwardBatch, q_shapes: list[tuple[int, int]],
         layouts: dict | None = None, arena: Arena | None = None) -> PassProbs | None:
    """Where the pass's attention writes the captured rows' probabilities; None where it cannot
    (the sequences capture different layers, or the captured layers' heads differ): collect()
    computes them after the pass then. layouts: the caller's, kept between passes: the Layout of
    a batch of the same shape (a decode's every step) is reused, its rows' fields written again;
    arena: where the probabilities go (else a tensor of their own)."""
    starts = batch.query_starts
    lay = layouts.get("last") if layouts is not None else None
    if lay is None or not lay.fits(starts, capture.specs):
        lay = _layout(capture, starts, q_shapes)
        if lay is None:
            return None
        if layouts is not None:
            layouts["last"] = lay  # (one shape kept: a batch that changes shape makes its layout again)
    heads, n, meta = lay.heads, len(lay.layers), lay.meta
    seqs, offset = [], 0
    for b, spec in lay.captured:
        end, ctx, max_keys = starts[b + 1], batch.context_lens[b], spec.max_keys
        rows = min(end - starts[b], max_keys)
        k_head, k_start = key_window(ctx, max_keys, spec.first_keys)
        columns = k_head + ctx - k_start
        for r in range(rows):  # the sequence's last `rows` rows, as collect() keeps them
            at = (end - rows + r) * FIELDS
            meta[at:at + FIELDS] = [offset + r * columns, heads * rows * columns, rows * columns, columns, k_head,
                                    k_start]
        seqs.append(SeqProbs(b, offset, rows, columns, ctx, k_head, k_start))
        offset += n * heads * rows * columns
    out = (arena or Arena(chunk=0)).take(offset)
    return PassProbs(lay.layers, heads, out, meta, lay.where, seqs)


def kept(probs: PassProbs, capture: PassCapture, windows: list[int | None]) -> None:
    """After the call: each captured sequence's AttentionCapture (windows: each layer's sliding
    window, None: global), which collect() then leaves as it is."""
    wins = [windows[i] for i in probs.layers]
    n = len(probs.layers)
    out = probs.out.tensor(-1)
    for s in probs.seqs:
        part = out[s.offset:s.offset + n * probs.heads * s.rows * s.columns].view(n, probs.heads, s.rows, s.columns)
        spec = capture.specs[s.b]
        if spec.heads is not None:
            part = part[:, spec.heads]
        capture.attention[s.b] = AttentionCapture(list(probs.layers), wins, s.ctx - s.rows, s.k_start, part,
                                                  s.k_head)
