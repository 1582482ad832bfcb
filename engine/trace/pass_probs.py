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

import torch

from engine.batch import ForwardBatch
from engine.trace.arena import Arena, Slice
from engine.trace.capture import AttentionCapture, PassCapture, key_window

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


def plan(capture: PassCapture, batch: ForwardBatch, q_shapes: list[tuple[int, int]],
         layouts: dict | None = None, arena: Arena | None = None) -> PassProbs | None:
    """Where the pass's attention writes the captured rows' probabilities; None where it cannot
    (the sequences capture different layers, or the captured layers' heads differ): collect()
    computes them after the pass then. layouts: the caller's, kept between passes: the arrays
    of a batch of the same shape (a decode's every step) are written again, not made; arena:
    where the probabilities go (else a tensor of their own)."""
    specs = [(b, s) for b, s in enumerate(capture.specs) if s is not None and s.attention_layers]
    if not specs:
        return None
    layers = specs[0][1].attention_layers
    if any(s.attention_layers != layers for _, s in specs) or any(not 0 <= i < len(q_shapes) for i in layers) \
            or len({q_shapes[i] for i in layers}) != 1:
        return None
    heads, n, starts = q_shapes[layers[0]][0], len(layers), batch.query_starts
    key = (tuple(starts), tuple((b, s.max_keys) for b, s in specs), tuple(layers), len(q_shapes))
    arrays = layouts.get(key) if layouts is not None else None
    if arrays is None:  # ctypes arrays, not tensors: run cold after the pass, a torch op costs several microseconds
        T = starts[-1]
        where = (ctypes.c_long * len(q_shapes))(*([-1] * len(q_shapes)))
        for j, i in enumerate(layers):
            where[i] = j
        arrays = (ctypes.c_long * (T * FIELDS))(*([-1] * (T * FIELDS))), where
        if layouts is not None:
            layouts.clear()  # (one shape kept: a batch that changes shape makes its arrays again)
            layouts[key] = arrays
    meta, where = arrays
    seqs, offset = [], 0
    for b, spec in specs:
        start, end, ctx = starts[b], starts[b + 1], batch.context_lens[b]
        rows = min(end - start, spec.max_keys)
        k_head, k_start = key_window(ctx, spec.max_keys, spec.first_keys)
        columns = k_head + ctx - k_start
        for r in range(rows):  # the sequence's last `rows` rows, as collect() keeps them
            at = (end - rows + r) * FIELDS
            meta[at:at + FIELDS] = [offset + r * columns, heads * rows * columns, rows * columns, columns, k_head,
                                    k_start]
        seqs.append(SeqProbs(b, offset, rows, columns, ctx, k_head, k_start))
        offset += n * heads * rows * columns
    out = (arena or Arena(chunk=0)).take(offset)
    return PassProbs(list(layers), heads, out, meta, where, seqs)


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
