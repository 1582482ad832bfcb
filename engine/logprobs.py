"""Log-probabilities of tokens, as an OpenAI client asks for them (logprobs, top_logprobs,
echo): the log-softmax of the model's raw logits at each position, before any penalty,
bias or temperature (vLLM's default, "raw" logprobs), so a harness that scores a text
reads the model itself, whatever the request's sampling knobs."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class TokenLogprob:
    """One position: the token there, its log-probability and rank (1 = the most likely),
    and the `top` most likely tokens with theirs, most likely first."""
    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"token_id": self.token_id, "logprob": self.logprob, "rank": self.rank,
                "top": [[t, lp] for t, lp in self.top]}


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """logits: [R, V] raw, one row per position; tokens: the token at each (R of them)."""
    if not tokens:
        return []
    lp = torch.log_softmax(logits[:len(tokens)].float(), dim=-1)  # [R, V]
    ids = torch.tensor(tokens, device=lp.device)[:, None]
    chosen = lp.gather(1, ids)  # [R, 1]
    ranks = (lp > chosen).sum(dim=-1) + 1  # ties share the better rank
    if top:
        top_lp, top_ids = torch.topk(lp, min(top, lp.shape[-1]), dim=-1)
        tops = [list(zip(i, v)) for i, v in zip(top_ids.tolist(), top_lp.tolist())]
    else:
        tops = [[] for _ in tokens]
    return [TokenLogprob(t, c, r, k) for t, c, r, k in zip(tokens, chosen[:, 0].tolist(), ranks.tolist(), tops)]
