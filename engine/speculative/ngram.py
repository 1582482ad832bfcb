"""N-gram prompt lookup (vLLM's `ngram` method): no second model and no KV pool; the
proposals are copied from what followed the last few tokens when they occurred before."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from engine.sequence import ScheduledSeq, Sequence


@dataclass(frozen=True)
class NgramMatch:
    start: int  # position of the earlier occurrence of the context's last n tokens
    n: int
    tokens: list[int]  # what followed it: the proposals, copied from positions start+n onward

    @property
    def sources(self) -> list[int]:
        return list(range(self.start + self.n, self.start + self.n + len(self.tokens)))


def find_ngram(tokens: list[int], k: int, max_n: int, min_n: int) -> NgramMatch | None:
    """The latest earlier occurrence of the last n tokens, for n from max_n down to min_n
    (a longer match is more likely to continue the same way), and up to k tokens that
    followed it. None when no n matches, or k is 0."""
    length = len(tokens)
    if k <= 0:
        return None
    ids = np.asarray(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        # every window that ends before the last token, so at least one token follows it
        windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)
        hits = np.flatnonzero((windows == ids[length - n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1])
            return NgramMatch(start, n, tokens[start + n:start + n + k])
    return None


class NgramProposer:
    """Prompt lookup: no second model and no KV pool. Proposals are copied from the
    request's own prompt and output, which pays when the answer repeats its input
    (code edits, quotes, summaries) or itself."""
    method = "ngram"

    def __init__(self, max_n: int, min_n: int, vocab_size: int, device: torch.device) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram lookup needs 1 <= prompt_lookup_min <= prompt_lookup_max "
                             f"(got {min_n} and {max_n})")
        self.max_n, self.min_n = max_n, min_n
        self.vocab_size, self.device = vocab_size, device
        self.matches: dict[str, NgramMatch] = {}  # each request's round in flight, for the trace

    def match(self, seq: Sequence, k: int) -> NgramMatch | None:
        return find_ngram(seq.token_ids, k, self.max_n, self.min_n)

    def lookahead(self, seq: Sequence, k: int) -> int:
        # No match: no round; the request decodes one token plainly this step.
        m = self.match(seq, k)
        return len(m.tokens) if m is not None else 0

    def propose(self, items: list[ScheduledSeq]) -> None:
        for item in items:
            # the same tokens the scheduler's lookahead saw, so the same match, cut to its size
            m = self.match(item.seq, item.num_draft)
            self.matches[item.seq.request_id] = m
            item.draft_tokens.extend(m.tokens)
            item.draft_probs.extend(self._one_hot(x) for x in m.tokens)

    def _one_hot(self, x: int) -> torch.Tensor:
        q = torch.zeros(self.vocab_size, device=self.device)
        q[x] = 1.0
        return q

    def accept(self, seq: Sequence, real_len: int, accepted: int, token_ids: list[int]) -> None:
        pass  # nothing to roll back: the context is the request's own tokens

    def free(self, seq: Sequence) -> None:
        self.matches.pop(seq.request_id, None)

    def describe(self, seq: Sequence, piece: Callable[[int], str]) -> dict:
        m = self.matches[seq.request_id]
        gram = seq.token_ids[m.start:m.start + m.n]
        # position: where the first proposal went (the context's length when the round began)
        return {"method": self.method, "position": len(seq), "copied_from": m.sources,
                "prompt_tokens": seq.num_prompt_tokens,
                "ngram": {"n": m.n, "start": m.start, "tokens": gram, "text": [piece(t) for t in gram]},
                "lookup": {"max_n": self.max_n, "min_n": self.min_n}}
