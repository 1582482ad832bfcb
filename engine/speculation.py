"""Speculative decoding's part of the engine's step (the proposers are engine/speculative):
how many draft tokens each decoding sequence verifies this step (the scheduler asks), the
proposals made before the pass, and after the commit what each round kept, counted."""
from __future__ import annotations

from engine.sequence import ScheduledSeq, Sequence
from engine.speculative.proposer import Proposer
from engine.step_pass import EngineStats, SeqStep, StepPass
from engine.step_trace import StepTrace


class Speculation:
    """One engine's: its proposer, its k, its context and its token budget per step."""

    def __init__(self, proposer: Proposer, k: int, max_model_len: int, max_num_batched_tokens: int) -> None:
        self.proposer, self.k = proposer, k
        self.max_model_len, self.max_num_batched_tokens = max_model_len, max_num_batched_tokens

    def lookahead(self, seq: Sequence) -> int:
        """Draft tokens to verify for this decoding sequence: k, less near its end, or
        what the proposer has (n-gram lookup: what follows the match, 0 without one)."""
        if not seq.speculative:
            return 0
        room = min(seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - len(seq))
        k = self.k if seq.spec_k is None else seq.spec_k
        k = max(0, min(k, room - 1, self.max_num_batched_tokens - 1))
        return self.proposer.lookahead(seq, k) if k else 0

    def propose(self, scheduled: list[ScheduledSeq]) -> None:
        """Draft tokens for the sequences that verify a round this step."""
        if any(s.num_draft for s in scheduled):
            self.proposer.propose([s for s in scheduled if s.num_draft])

    def count(self, step: StepPass, stats: EngineStats, trace: StepTrace) -> None:
        """After the commit: each round counted (and traced) by the tokens its sequence kept."""
        for part in step.parts:
            if part.verdict is not None:
                kept, proposed = count_round(part, stats)
                if part.scheduled.seq.traced:
                    trace.round(part, kept, proposed)


def count_round(part: SeqStep, stats: EngineStats) -> tuple[int, int]:
    """A round's proposals and accepted drafts, counted up to the last token its sequence
    kept (a round that ended the sequence early kept fewer) -> (kept, proposed)."""
    s, v = part.scheduled, part.verdict
    seq = s.seq
    kept = min(len(seq) - s.start - 1, len(v.tokens))  # the round began at position s.start + 1
    proposed = min(kept, len(s.draft_tokens)) if seq.is_finished else len(s.draft_tokens)
    accepted = min(v.accepted, kept)
    seq.spec_proposed += proposed
    seq.spec_accepted += accepted
    stats.spec_proposed += proposed
    stats.spec_accepted += accepted
    return kept, proposed
