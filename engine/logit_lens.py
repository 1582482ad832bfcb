"""The logit lens: what the model would answer if it stopped after each layer.

The residual stream at a sampled position is kept after the embedding and after every
layer (engine/model.py, only for the rows the engine marks: the sampled rows of sequences
traced at level `full`). After the pass each kept row goes through the model's own final
norm and LM head, as the last layer's output does: one [L + 1, hidden] x [hidden, vocab]
matmul per traced token. The last row is the model's own output, so its distribution is
the one the sampler saw (before temperature and the other knobs).
"""
from __future__ import annotations

import torch

DIGITS = 4  # significant digits kept: a lens row's chosen token may have p = 1e-9, which 4 decimals zero


def probabilities(model: torch.nn.Module, hidden: list[torch.Tensor]) -> torch.Tensor:
    """hidden: L + 1 tensors [R, hidden] (after the embedding, after each layer) ->
    float32 softmax over the vocabulary [L + 1, R, vocab]."""
    h = torch.stack(hidden)  # [L + 1, R, hidden]
    n, r = h.shape[0], h.shape[1]
    logits = model.compute_logits(model.model.norm(h.reshape(n * r, -1))).float()
    return torch.softmax(logits, dim=-1).view(n, r, -1)


def rows(probs: torch.Tensor, chosen: int, top: int) -> dict[str, list]:
    """probs: [L + 1, vocab] at one position; chosen: the token finally drawn there ->
    per layer the `top` candidates, and the chosen token's rank (1 = the top candidate)
    and probability, as plain lists (rounded like the rest of the trace)."""
    top_probs, top_ids = probs.topk(min(top, probs.shape[-1]), dim=-1)
    chosen_p = probs[:, chosen]
    rank = (probs > chosen_p[:, None]).sum(dim=-1) + 1
    return {"top_ids": top_ids.tolist(), "top_probs": _rounded(top_probs), "chosen_rank": rank.tolist(),
            "chosen_prob": _rounded(chosen_p)}


def event(probs: torch.Tensor, chosen: int, top: int, piece) -> dict:
    """The `logit_lens` event's data: `layers`, one row per residual-stream point (row 0:
    after the embedding; row i: after layer i - 1; the last row: the model's output)."""
    r = rows(probs, chosen, top)
    layers = [{"top_ids": ids, "top_probs": ps, "top_texts": [piece(t) for t in ids], "chosen_rank": rank,
               "chosen_prob": cp}
              for ids, ps, rank, cp in zip(r["top_ids"], r["top_probs"], r["chosen_rank"], r["chosen_prob"])]
    return {"token_id": chosen, "token_text": piece(chosen), "layers": layers}


def _rounded(x: torch.Tensor) -> list:
    return [[float(f"{v:.{DIGITS}g}") for v in row] if isinstance(row, list) else float(f"{row:.{DIGITS}g}")
            for row in x.tolist()]
