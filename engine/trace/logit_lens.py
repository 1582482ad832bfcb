"""The logit lens: what the model would answer if it stopped after each layer.

The residual stream at a sampled position is kept after the embedding and after every
layer but the last (engine/model.py, only for the rows the engine marks: the sampled rows
of sequences traced at level `full`). Each kept row goes through the model's own final
norm and LM head in float32; the lens's last row is the model's own output row, so its
distribution is the one the sampler saw (before temperature and the other knobs).

Two ways, the same numbers (the CPU kernel forms each row's products alone, whatever
rows share its call):
- in the pass (logits_with_lens, the kept rows ahead of the model's own in one matmul),
  where a capture does not ask for later;
- later (capture.lens_later: the engine's way): the pass computes only the model's own
  rows, the step keeps each token's [L, hidden] rows, and lens_stats() puts them through
  the norm and the head after the step, batched over tokens and points (engine/trace/
  lens_queue.py says when). The exact lens costs L x hidden x vocab multiply-adds a token
  (SmolLM2: 0.85 G, more than the model itself): off the step, the stream does not wait
  for it.
Its trace event is built by engine/trace/events.py's logit_lens_of().
"""
from __future__ import annotations

import torch

from engine.kernels import cpu as cpu_kernels
from engine.trace.capture import PassCapture
from engine.trace.softmax_stats import SoftmaxStats, softmax_stats


def logits_with_lens(model: torch.nn.Module, hidden: torch.Tensor, capture: PassCapture | None) -> torch.Tensor:
    """hidden: [R, hidden], the final (normed) hidden states of the rows the pass returns
    logits for -> their logits [R, vocab] float32. With a lens (capture.lens_hidden: L
    tensors [n, hidden]) the matmul also takes the L * n kept rows, normed, ahead of them:
    capture.lens_logits [L * n + R, vocab] then holds every lens row; unless the capture
    keeps them for later (lens_later): then lens_hidden stays as the pass left it."""
    if capture is None or getattr(capture, "lens_later", False):
        return model.compute_logits(hidden).float()
    capture.ready()
    if not capture.lens_hidden:
        return model.compute_logits(hidden).float()
    kept = capture.lens_hidden  # L tensors [n, hidden], or (the one-call stack's) one [L * n, hidden]
    inner = model.model.norm(kept[0] if len(kept) == 1 else torch.cat(kept))  # [L * n, hidden], layer by layer
    capture.lens_hidden = []
    both = model.compute_logits(torch.cat([inner, hidden]), exact_rows=inner.shape[0]).float()
    capture.lens_logits, capture.lens_returned = both, hidden.shape[0]
    return both[inner.shape[0]:]


def kept_rows(capture: PassCapture, n: int) -> torch.Tensor:
    """The pass's kept residual stream as [L, n, hidden] (n: its lens rows), a view where it can be."""
    kept = capture.lens_hidden
    if len(kept) == 1:  # the one-call stack's [L * n, hidden], layer-major
        return kept[0].view(-1, n, kept[0].shape[-1])
    return torch.stack(kept)


def lens_stats(model: torch.nn.Module, rows: torch.Tensor, chosen: list[int], top: int,
               chunk: int = 0) -> SoftmaxStats:
    """rows: [N, hidden] residual-stream rows (before the final norm) -> the softmax stats of
    their lens (top candidates, the chosen token's rank and probability per row), float32,
    through the model's own norm and LM head, `chunk` rows a call (0: the CPU kernel's
    MAX_ROWS, where a call streams the head's weight once for all its rows)."""
    chunk = chunk or cpu_kernels.MAX_ROWS
    parts = []
    for lo in range(0, rows.shape[0], chunk):
        inner = model.model.norm(rows[lo:lo + chunk])
        z = model.compute_logits(inner, exact_rows=inner.shape[0]).float()
        parts.append(softmax_stats(z, top, chosen[lo:lo + chunk]))
    return join(parts)


def join(parts: list[SoftmaxStats]) -> SoftmaxStats:
    """Stats of consecutive row blocks as one (their rows in order)."""
    out = SoftmaxStats([], [], [], [], [], [], [])
    for s in parts:
        out.top_ids += s.top_ids
        out.top_probs += s.top_probs
        out.lse += s.lse
        out.entropy += s.entropy
        out.kept += s.kept
        out.rank += s.rank
        out.chosen_probs += s.chosen_probs
    return out
