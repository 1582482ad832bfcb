"""Continuous batching with chunked prefill.

Each step spends a token budget: first one token for every decoding sequence,
then chunks of unfinished prefills, then new sequences from the queue (their
prefix-cache hits are free). When the KV pool runs dry, the most recently
admitted sequence is preempted: its blocks are freed and it is recomputed later.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.sequence import ScheduledSeq, Sequence, Status
from engine.static_batching import StaticBatch


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    out_of_memory: list[Sequence] = field(default_factory=list)  # cannot grow even alone


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager,
                 lookahead: Callable[[Sequence], int] | None = None) -> None:
        self.config = config
        self.bm = block_manager
        self.lookahead = lookahead  # draft tokens a decoding sequence verifies per step
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_steps = 0
        # batching="static": only the members of the batch now running may be admitted
        self.static = StaticBatch(config.max_num_seqs) if config.batching == "static" else None

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def holding(self) -> list[Sequence]:
        """The sequences whose blocks are in this pool (kv.pool and the pool's invariants read them)."""
        return self.running + list(self.waiting)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        decoding = [s for s in self.running if s.num_computed_tokens == len(s) - 1]
        prefilling = [s for s in self.running if s.num_computed_tokens < len(s) - 1]
        if decoding and self.lookahead is not None:  # take turns when rounds do not all fit
            turn = self.num_steps % len(decoding)
            decoding = decoding[turn:] + decoding[:turn]
        self.num_steps += 1
        for seq in decoding + prefilling:
            if budget == 0:
                break
            if seq.status != Status.RUNNING:  # preempted earlier in this loop
                continue
            plan = self._plan(seq, len(seq) - seq.num_computed_tokens, budget)
            if plan is None:
                continue
            n, draft = plan
            if not self._make_room(seq, n + draft, out):
                continue
            start = seq.num_computed_tokens
            self.bm.allocate(seq, n + draft)
            out.scheduled.append(ScheduledSeq(seq, start, n + draft, draft))
            budget -= n + draft
        # Admit new work only when nothing had to give way this step.
        while self.waiting and budget > 0 and not out.preempted and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if self.static is not None and not self.static.may_admit(seq, self.running, self.waiting):
                break
            # prompt logprobs need every prompt position's logits: no cached prefix (as vLLM)
            hits = self.bm.match_prefix(seq) if seq.params.prompt_logprobs is None else []
            plan = self._plan(seq, len(seq) - len(hits) * self.bm.block_size, budget)
            if plan is None or self.bm.blocks_needed(seq, sum(plan), hits) > self.bm.num_free_blocks:
                break
            n, draft = plan
            self.waiting.popleft()
            self.bm.admit(seq, hits)
            self.bm.allocate(seq, n + draft)
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.admitted.append(seq)
            out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, n + draft, draft))
            budget -= n + draft
        if not out.scheduled and self.waiting and not self.running:
            out.out_of_memory.append(self.waiting[0])  # too big for the empty pool: never fits
        return out

    def _plan(self, seq: Sequence, remaining: int, budget: int) -> tuple[int, int] | None:
        """(tokens to compute, draft tokens to verify) for seq this step, with `remaining`
        of its tokens not computed yet; None: it waits a step.

        Speculation keeps a seeded request's random draws the same in any batch: its first
        token always comes from the prefill; later tokens come from rounds whose size
        depends on the request alone (when the budget cannot hold a round, the request
        waits rather than shrink it); and a preempted request, recomputed, leaves its last
        token for the round it would have run."""
        n = min(remaining, budget)
        k = self.lookahead(seq) if self.lookahead is not None and seq.num_output_tokens else 0
        if not k:
            return n, 0
        if remaining == 1:
            return (1, k) if 1 + k <= budget else None
        return (n - 1 if n == remaining else n), 0

    def _make_room(self, seq: Sequence, n: int, out: SchedulerOutput) -> bool:
        """Preempt later sequences until seq's next n tokens fit. False if seq itself
        had to go (preempted, or alone and still too big for the whole pool)."""
        while self.bm.blocks_needed(seq, n) > self.bm.num_free_blocks:
            victim = self.running[-1]
            if victim is seq and len(self.running) == 1:
                out.out_of_memory.append(seq)  # the pool cannot hold this sequence at all
                return False
            if any(s.seq is victim for s in out.scheduled):
                # Never preempt what is already in this batch: give way ourselves.
                victim = seq
            self.preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.free_seq(seq)
        seq.status = Status.WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.status == Status.RUNNING:
            self.running.remove(seq)
            self.bm.free_seq(seq)
        elif seq.status == Status.WAITING:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
