"""Speculative decoding: something cheap proposes k tokens, the target checks them
all in one forward pass, and the longest acceptable prefix is kept plus one token
from the target. Two proposers share one small interface (`Proposer`): a small draft
model (`Speculator`), or n-gram prompt lookup (`NgramProposer`, vLLM's `ngram`
method), which copies what followed the last few tokens when they occurred before.

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

from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np
import torch

from engine.block_manager import BlockManager
from engine.model_runner import ModelRunner
from engine.sampler import draw, filter_logits
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledSeq
from engine.sequence import Sequence


NGRAM = "ngram"  # the `draft` that asks for n-gram prompt lookup instead of a draft model


@dataclass
class DraftView:
    """The draft model's side of a sequence: same tokens, its own blocks and progress.
    Shaped like a Sequence so the block manager and model runner serve it as is."""
    seq: Sequence
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    hashed_upto: int = 0  # tokens already offered to the draft's prefix cache
    traced: bool = False  # draft blocks are not drawn in the KV grid

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids

    @property
    def request_id(self) -> str:
        return self.seq.request_id

    @property
    def num_preemptions(self) -> int:
        return self.seq.num_preemptions

    def __len__(self) -> int:
        return len(self.seq)


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


class Proposer(Protocol):
    """What the engine needs from a way to propose tokens."""
    method: str  # "draft" or "ngram", for the trace

    def lookahead(self, seq: Sequence, k: int) -> int:
        """How many proposals seq will verify in its next round (at most k). It must
        depend on seq alone, so a seeded request's rounds are the same in any batch."""

    def propose(self, items: list[ScheduledSeq]) -> None:
        """Fill each item's draft_tokens and draft_probs (q, [V] each) with its proposals."""

    def accept(self, seq: Sequence, real_len: int, accepted: int, token_ids: list[int]) -> None:
        """After verification: `accepted` proposals survived; token_ids are the kept tokens."""

    def free(self, seq: Sequence) -> None:
        """Forget seq's state: it finished, was aborted, or was preempted."""

    def describe(self, seq: Sequence, piece: Callable[[int], str]) -> dict:
        """What the `spec` event adds about seq's last round: the method, and its details
        (piece: a token's text)."""


class Speculator:
    """Runs the draft model: its own weights, paged KV pool and prefix cache."""
    method = "draft"

    def __init__(self, runner: ModelRunner, block_manager: BlockManager, max_tokens_per_pass: int) -> None:
        self.runner = runner
        self.bm = block_manager
        self.max_tokens_per_pass = max_tokens_per_pass  # the engine's step budget: no huge draft prefill
        self.views: dict[str, DraftView] = {}

    def lookahead(self, seq: Sequence, k: int) -> int:
        return k  # the draft can always guess

    def describe(self, seq: Sequence, piece: Callable[[int], str]) -> dict:
        return {"method": self.method}

    def propose(self, items: list[ScheduledSeq]) -> None:
        """Fill each item's draft_tokens/draft_probs with up to item.num_draft proposals.
        An item whose draft cannot get KV blocks verifies nothing this step. The draft's
        pool is larger than the target's, so that happens only when the draft's prefix
        cache shares fewer blocks than the target's does."""
        active: list[tuple[ScheduledSeq, DraftView]] = []
        for item in items:
            view = self._view(item.seq)
            # catch up on every real token, then room for the proposals fed back in
            needed = len(item.seq) - view.num_computed_tokens + item.num_draft - 1
            if self.bm.blocks_needed(view, needed) > self.bm.num_free_blocks:
                self.drop_proposals(item)
                continue
            self.bm.allocate(view, needed)
            active.append((item, view))
        self._catch_up([view for _, view in active])
        while active:  # one token each: the last real one, then each proposal fed back in
            steps = [ScheduledSeq(view, view.num_computed_tokens, 1, draft_tokens=item.draft_tokens)
                     for item, view in active]
            batch = self.runner.prepare(steps, [None] * len(steps))
            logits = self.runner.run(batch, [e - 1 for e in batch.query_starts[1:]])
            for (item, view), step, row in zip(active, steps, logits):
                view.num_computed_tokens += step.num_tokens
                q = distribution(row, item.seq.params)
                x = int(row.argmax()) if item.seq.params.greedy else draw(q, item.seq.generator)
                item.draft_tokens.append(x)
                item.draft_probs.append(q)
            active = [(item, view) for item, view in active if len(item.draft_tokens) < item.num_draft]

    def _catch_up(self, views: list[DraftView]) -> None:
        """Feed the draft every real token but the last (a new prompt, or tokens the target
        produced), in passes no bigger than the step budget, as the target's prefill is."""
        while True:
            steps, room = [], self.max_tokens_per_pass
            for view in views:
                n = min(len(view) - 1 - view.num_computed_tokens, room)
                if n > 0:
                    steps.append(ScheduledSeq(view, view.num_computed_tokens, n))
                    room -= n
            if not steps:
                return
            self.runner.run(self.runner.prepare(steps, [None] * len(steps)), [])
            for step in steps:
                step.seq.num_computed_tokens += step.num_tokens

    @staticmethod
    def drop_proposals(item: ScheduledSeq) -> None:
        item.num_tokens -= item.num_draft
        item.num_draft = 0

    def accept(self, seq: Sequence, real_len: int, accepted: int, token_ids: list[int]) -> None:
        """Roll the draft's cache back to the tokens that survived verification."""
        view = self.views.get(seq.request_id)
        if view is None:
            return
        view.num_computed_tokens = min(view.num_computed_tokens, real_len + accepted)
        self.bm.truncate(view, view.num_computed_tokens)
        self.bm.commit_full_blocks(view, view.hashed_upto, token_ids)
        view.hashed_upto = view.num_computed_tokens

    def free(self, seq: Sequence) -> None:
        view = self.views.pop(seq.request_id, None)
        if view is not None:
            self.bm.free_seq(view)

    def _view(self, seq: Sequence) -> DraftView:
        view = self.views.get(seq.request_id)
        if view is None:
            view = self.views[seq.request_id] = DraftView(seq)
            self.bm.admit(view, self.bm.match_prefix(view))
            view.hashed_upto = view.num_computed_tokens
        return view


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
