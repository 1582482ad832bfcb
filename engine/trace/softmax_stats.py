"""What a trace shows of a softmax over the vocabulary, read from the logits.

The `sample` event (engine/sampler.py: explain) and the `logit_lens` event need, per
row of logits, the top candidates and their probabilities, a chosen token's rank and
probability, the entropy and how many tokens keep a nonzero probability: a few numbers
out of a vocabulary-sized softmax that is never shown. On the CPU one C call computes
them without the softmax (cpu_stats.c; the lens has 31 rows of 49k logits per SmolLM2
token, many PyTorch ops); elsewhere, and as the test oracle, the PyTorch ops do.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import torch

from engine.kernels import cpu


@dataclass
class SoftmaxStats:
    """Per row r of logits z: p = softmax(z), float32 semantics."""
    top_ids: list[list[int]]  # the k largest, descending
    top_probs: list[list[float]]
    lse: list[float]  # log-sum-exp: any token's probability is exp(z - lse)
    entropy: list[float]  # -sum p log p, nats
    kept: list[int]  # tokens whose float32 probability is not 0 (-inf logits: masked, 0)
    rank: list[int] | None = None  # of the chosen token: 1 + the logits above its own
    chosen_probs: list[float] | None = None


def softmax_stats(z: torch.Tensor, k: int, chosen: list[int] | None = None) -> SoftmaxStats:
    """z: [R, V] logits (-inf for masked tokens; any row stride); k: candidates a row
    (at most V); chosen: one token per row to rank, or None."""
    k = min(k, z.shape[-1])
    if by_kernel(z):
        return _c_stats(z, k, chosen)
    return reference(z, k, chosen)


def by_kernel(z: torch.Tensor) -> bool:
    """Whether softmax_stats reads z by the C kernel (whose candidates for k are the first k
    of those for any larger k: first_candidates)."""
    return z.device.type == "cpu" and z.dtype == torch.float32 and z.stride(-1) == 1 and cpu.available()


def _c_stats(z: torch.Tensor, k: int, chosen: list[int] | None) -> SoftmaxStats:
    R, V = z.shape
    out = torch.empty(R, 6 + 2 * k, dtype=torch.float64)  # per row: see tt_dist_stats
    c = (ctypes.c_long * R)(*chosen) if chosen is not None else None
    cpu.library().tt_dist_stats(z.data_ptr(), R, V, z.stride(0), k, c, out.data_ptr(), torch.get_num_threads())
    rows = out.tolist()
    s = SoftmaxStats([[int(i) for i in r[6:6 + k]] for r in rows], [_probabilities(r[6 + k:], r[1]) for r in rows],
                     [r[1] for r in rows], [r[2] for r in rows], [int(r[3]) for r in rows])
    if chosen is not None:
        s.rank = [int(r[4]) + 1 for r in rows]
        s.chosen_probs = [probability(r[5] - r[1]) for r in rows]
    return s


def first_candidates(s: SoftmaxStats, k: int) -> SoftmaxStats:
    """s with only its first k candidates a row: what softmax_stats with k gives where the C
    kernel made s (its list is ordered by logit, then id: a prefix of any longer one)."""
    return SoftmaxStats([ids[:k] for ids in s.top_ids], [p[:k] for p in s.top_probs], s.lse, s.entropy, s.kept,
                        s.rank, s.chosen_probs)


def _probabilities(z: list[float], lse: float) -> list[float]:
    """probability(v - lse) for each v, in one comprehension (a traced token has ~(L + 2) x top of them)."""
    return [math.exp(x) if x == x and x != -math.inf else 0.0 for x in [v - lse for v in z]]


def probability(x: float) -> float:
    """exp(z - lse) as a float, given z - lse: 0 for a masked token (-inf), and where every
    token is masked (-inf - -inf = nan)."""
    return math.exp(x) if x == x and x != -math.inf else 0.0


def reference(z: torch.Tensor, k: int, chosen: list[int] | None = None) -> SoftmaxStats:
    """The same by PyTorch ops: the path off the CPU, and the C kernel's oracle."""
    z = z.float()
    p = torch.softmax(z, dim=-1)
    top_z, ids = z.topk(k, dim=-1)
    lse = torch.logsumexp(z, dim=-1)
    out = SoftmaxStats(ids.tolist(), p.gather(-1, ids).tolist(), lse.tolist(),
                       (-(p * p.log()).nansum(dim=-1)).tolist(), torch.count_nonzero(p, dim=-1).tolist())
    if chosen is not None:
        c = torch.tensor(chosen, device=z.device)[:, None]
        out.rank = ((z > z.gather(-1, c)).sum(dim=-1) + 1).tolist()
        out.chosen_probs = p.gather(-1, c)[:, 0].tolist()
    return out
