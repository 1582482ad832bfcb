"""Verification: the target's logits at the last real token and at each of k proposals
decide which proposals are kept, and the token that follows them.

Greedy requests keep draft tokens that equal the target's argmax. Sampled requests
use the rejection rule of Leviathan et al. / Chen et al.: keep x with probability
min(1, p(x)/q(x)); at the first rejection draw from normalise(max(0, p - q)); when
all k are kept draw a bonus token from p. The output then follows exactly the
target's distribution. p and q are both taken after temperature, top-k, top-p, min-p.
An n-gram proposal is not drawn, so its q is one-hot: x is kept with probability p(x),
and a rejection draws from max(0, p - q), which is p with x removed. Same code, same
guarantee.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampler import draw, filter_logits
from engine.sampling_params import SamplingParams


@dataclass
class Verdict:
    accepted: int  # draft tokens kept
    tokens: list[int]  # accepted drafts + the target's corrected or bonus token
    target_probs: list[float]  # p(x) of each proposal
    draft_probs: list[float]  # q(x) of each proposal


def distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a token is drawn from under these params ([V], float32). Greedy
    requests take the argmax and never draw; for them this is the plain softmax, so the
    trace can say how sure each model was."""
    if params.greedy:
        return torch.softmax(logits.float(), dim=-1)
    return torch.softmax(filter_logits(logits, params), dim=-1)


def verify(target_logits: torch.Tensor, drafts: list[int], draft_probs: list[torch.Tensor],
           params: SamplingParams, generator: torch.Generator | None) -> Verdict:
    """target_logits: [k+1, V] at the last real token and at each proposal."""
    k = len(drafts)
    p = [distribution(target_logits[i], params) for i in range(k + 1)]
    p_x = [float(p[i][x]) for i, x in enumerate(drafts)]
    q_x = [float(draft_probs[i][x]) for i, x in enumerate(drafts)]
    tokens: list[int] = []
    for i, x in enumerate(drafts):
        if params.greedy:
            if x != int(target_logits[i].argmax()):
                tokens.append(int(target_logits[i].argmax()))
                return Verdict(i, tokens, p_x, q_x)
        else:
            r = float(torch.rand((), generator=generator, device=target_logits.device))
            if r >= min(1.0, p_x[i] / q_x[i]):
                residual = torch.clamp(p[i] - draft_probs[i], min=0)
                if residual.sum() <= 0:  # p == q up to rounding: any draw from p is right
                    residual = p[i]
                tokens.append(draw(residual, generator))
                return Verdict(i, tokens, p_x, q_x)
        tokens.append(x)
    last = p[k]
    bonus = int(target_logits[k].argmax()) if params.greedy else draw(last, generator)
    return Verdict(k, tokens + [bonus], p_x, q_x)
