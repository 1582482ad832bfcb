"""The logit lens: what the model would answer if it stopped after each layer.

The residual stream at a sampled position is kept after the embedding and after every
layer but the last (engine/model.py, only for the rows the engine marks: the sampled rows
of sequences traced at level `full`). After the pass each kept row goes through the
model's own final norm and LM head, in the same matmul as the rows the model itself
samples from: the LM head's weight is the largest (SmolLM2: 113 MB) and a second matmul
would stream it from memory again (3.6 ms a token on this project's CPU). The lens's last
row is the model's own output row, so its distribution is the one the sampler saw
(before temperature and the other knobs).
"""
from __future__ import annotations

import torch

from engine.trace.softmax_stats import softmax_stats

DIGITS = 4  # significant digits kept: a lens row's chosen token may have p = 1e-9, which 4 decimals zero


def logits_with_lens(model: torch.nn.Module, hidden: torch.Tensor, batch) -> torch.Tensor:
    """hidden: [R, hidden], the final (normed) hidden states of the rows the pass returns
    logits for -> their logits [R, vocab] float32. With a lens (batch.lens_hidden: L
    tensors [n, hidden]) the matmul also takes the L * n kept rows, normed, ahead of them:
    batch.lens_logits [L * n + R, vocab] then holds every lens row (see rows())."""
    if not batch.lens_hidden:
        return model.compute_logits(hidden).float()
    inner = model.model.norm(torch.cat(batch.lens_hidden))  # [L * n, hidden], layer by layer
    batch.lens_hidden = []
    both = model.compute_logits(torch.cat([inner, hidden])).float()
    batch.lens_logits, batch.lens_returned = both, hidden.shape[0]
    return both[inner.shape[0]:]


def rows(batch, j: int) -> torch.Tensor:
    """The lens of the j-th lens row (batch.lens_rows[j]): [L + 1, vocab] logits, row 0
    after the embedding, row i after layer i - 1, the last the model's own output."""
    n = len(batch.lens_out_rows)
    z = batch.lens_logits
    L = (z.shape[0] - batch.lens_returned) // n
    if batch.lens_returned == n and batch.lens_out_rows[j] == j:  # every returned row has a lens: a plain stride
        return z.view(L + 1, n, -1)[:, j]
    index = [layer * n + j for layer in range(L)] + [L * n + batch.lens_out_rows[j]]
    return z[torch.tensor(index, device=z.device)]


def event(logits: torch.Tensor, chosen: int, top: int, piece) -> dict:
    """logits: [L + 1, vocab] at one position (rows()); chosen: the token finally drawn
    there -> the `logit_lens` event's data: `layers`, one per residual-stream point, each
    with its `top` candidates, and the chosen token's rank (1 = the top candidate) and
    probability, rounded like the rest of the trace."""
    s = softmax_stats(logits, top, [chosen] * logits.shape[0])
    layers = [{"top_ids": ids, "top_probs": [_rounded(p) for p in ps], "top_texts": [piece(t) for t in ids],
               "chosen_rank": rank, "chosen_prob": _rounded(cp)}
              for ids, ps, rank, cp in zip(s.top_ids, s.top_probs, s.rank, s.chosen_probs)]
    return {"token_id": chosen, "token_text": piece(chosen), "layers": layers}


def _rounded(v: float) -> float:
    return float(f"{v:.{DIGITS}g}")
