"""Expert parallelism's one loop: a rank's share of a MoE layer's output, from the experts it
holds (the others' rows come from the other ranks' partial sums, added by the all-reduce)."""
from __future__ import annotations

from typing import Callable

import torch


def local_expert_sum(x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, first: int, num_local: int,
                     expert: Callable[[torch.Tensor, int], torch.Tensor]) -> torch.Tensor:
    """x [T, H]; experts [T, k] global ids, weights [T, k] in x's dtype; this rank holds experts
    [first, first + num_local), expert(rows, e) runs its local expert e. Returns [T, H]."""
    out = torch.zeros_like(x)
    local = experts - first  # this rank's experts as 0..num_local-1
    load = torch.bincount(local[(local >= 0) & (local < num_local)], minlength=num_local)
    for e in load.nonzero().flatten().tolist():
        token_idx, slot = torch.where(local == e)
        out.index_add_(0, token_idx, expert(x[token_idx], e) * weights[token_idx, slot, None])
    return out
