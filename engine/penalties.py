"""The stages before temperature that change the logits from what came before, in vLLM's
order: a structured output's grammar mask, min_tokens, logit_bias, then the penalties
(repetition, frequency, presence).

  grammar             Matcher: the tokens that cannot continue a valid answer -> -inf

  min_tokens          until that many tokens exist, the stop tokens (end of sequence unless
                      ignore_eos, and stop_token_ids) are masked to -inf
  logit_bias          OpenAI's: a token id -> a number added to its logit
  repetition_penalty  vLLM's and transformers' (CTRL's): each token of the prompt or output has
                      its logit divided by the penalty if positive, multiplied if not
  frequency_penalty   OpenAI's, over the output only: minus the penalty times the token's count
  presence_penalty    OpenAI's, over the output only: minus the penalty once for a token present

Each stage that is on is kept (a knob that is off adds no stage), so the trace shows what
each one changed: the tokens whose logit moved, and by how much.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampling_params import SamplingParams
from engine.structured import Matcher

ADJUSTMENTS = ("grammar", "min_tokens", "logit_bias", "repetition_penalty", "frequency_penalty", "presence_penalty")


@dataclass
class History:
    """What the stages read of one sequence: its tokens so far and what min_tokens masks."""
    prompt_ids: list[int]
    output_ids: list[int]
    stop_ids: list[int]  # end-of-sequence (unless ignore_eos) and stop_token_ids
    grammar: Matcher | None = None  # a structured output's place in its grammar


def adjust_stages(logits: torch.Tensor, params: SamplingParams, history: History) -> dict[str, torch.Tensor]:
    """The logits [V] (float32) after each stage that is on, in order; {} when none is."""
    x = logits.float()
    stages: dict[str, torch.Tensor] = {}
    V = x.shape[-1]
    if history.grammar is not None:
        x = history.grammar.mask(x)
        stages["grammar"] = x
    if params.min_tokens and len(history.output_ids) < params.min_tokens and history.stop_ids:
        masked = x.clone()
        masked[torch.tensor(history.stop_ids, device=x.device)] = float("-inf")
        if torch.isfinite(masked).any():  # a grammar that allows only the end wins: something must be drawn
            x = stages["min_tokens"] = masked
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), device=x.device)
        x = x.index_add(0, ids, torch.tensor(list(params.logit_bias.values()), device=x.device, dtype=x.dtype))
        stages["logit_bias"] = x
    if params.repetition_penalty != 1.0:
        seen = torch.zeros(V, dtype=torch.bool, device=x.device)
        seen[torch.tensor(history.prompt_ids + history.output_ids, device=x.device)] = True
        penalized = torch.where(x > 0, x / params.repetition_penalty, x * params.repetition_penalty)
        x = torch.where(seen, penalized, x)
        stages["repetition_penalty"] = x
    if (params.frequency_penalty or params.presence_penalty) and history.output_ids:
        counts = torch.bincount(torch.tensor(history.output_ids, device=x.device), minlength=V)[:V].to(x.dtype)
        if params.frequency_penalty:
            x = x - params.frequency_penalty * counts
            stages["frequency_penalty"] = x
        if params.presence_penalty:
            x = x - params.presence_penalty * (counts > 0).to(x.dtype)
            stages["presence_penalty"] = x
    return stages


def changes(before: torch.Tensor, after: torch.Tensor, top: int) -> tuple[int, list[list]]:
    """What a stage changed: (how many tokens' logits moved, the `top` largest moves as
    [token id, logit change]). Masked tokens (-inf now) come first, the most likely before
    first (the candidates a grammar removed), their change None; then the largest moves."""
    moved = before != after
    n = int(moved.sum())
    if not n:
        return 0, []
    masked = moved & torch.isneginf(after)
    out = []
    if masked.any():
        ids = masked.nonzero().flatten()
        order = torch.topk(before[ids], min(top, len(ids))).indices
        out = [[int(ids[i]), None] for i in order]
    rest = moved & ~masked
    if rest.any() and len(out) < top:
        ids = rest.nonzero().flatten()
        delta = after[ids] - before[ids]
        order = torch.topk(delta.abs(), min(top - len(out), len(ids))).indices
        out += [[int(ids[i]), round(float(delta[i]), 6)] for i in order]
    return n, out
