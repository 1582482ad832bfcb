"""The logit lens: what the model would answer if it stopped after each layer.

The residual stream at a sampled position is kept after the embedding and after every
layer but the last (engine/model.py, only for the rows the engine marks: the sampled rows
of sequences traced at level `full`). After the pass each kept row goes through the
model's own final norm and LM head, in the same matmul as the rows the model itself
samples from: the LM head's weight is the largest (SmolLM2: 113 MB) and a second matmul
would stream it from memory again (3.6 ms a token on this project's CPU). The lens's last
row is the model's own output row, so its distribution is the one the sampler saw
(before temperature and the other knobs). Its trace event is built by
engine/trace/events.py's logit_lens().
"""
from __future__ import annotations

import torch

from engine.trace.capture import PassCapture


def logits_with_lens(model: torch.nn.Module, hidden: torch.Tensor, capture: PassCapture | None) -> torch.Tensor:
    """hidden: [R, hidden], the final (normed) hidden states of the rows the pass returns
    logits for -> their logits [R, vocab] float32. With a lens (capture.lens_hidden: L
    tensors [n, hidden]) the matmul also takes the L * n kept rows, normed, ahead of them:
    capture.lens_logits [L * n + R, vocab] then holds every lens row (see rows())."""
    if capture is None or not capture.lens_hidden:
        return model.compute_logits(hidden).float()
    kept = capture.lens_hidden  # L tensors [n, hidden], or (the one-call stack's) one [L * n, hidden]
    inner = model.model.norm(kept[0] if len(kept) == 1 else torch.cat(kept))  # [L * n, hidden], layer by layer
    capture.lens_hidden = []
    both = model.compute_logits(torch.cat([inner, hidden]), exact_rows=inner.shape[0]).float()
    capture.lens_logits, capture.lens_returned = both, hidden.shape[0]
    return both[inner.shape[0]:]


def rows(capture: PassCapture, j: int) -> torch.Tensor:
    """The lens of the j-th lens row (capture.lens_rows[j]): [L + 1, vocab] logits, row 0
    after the embedding, row i after layer i - 1, the last the model's own output."""
    n = len(capture.lens_out_rows)
    z = capture.lens_logits
    L = (z.shape[0] - capture.lens_returned) // n
    if capture.lens_returned == n and capture.lens_out_rows[j] == j:  # every returned row has a lens: a plain stride
        return z.view(L + 1, n, -1)[:, j]
    index = [layer * n + j for layer in range(L)] + [L * n + capture.lens_out_rows[j]]
    return z[torch.tensor(index, device=z.device)]
