"""One step's forward pass as the engine reads it back and commits it: which rows of the
flattened batch get logits (the last token of each sequence that samples, all k+1 positions
a speculative round verifies, then the prompt positions whose log-probabilities were asked
for), each scheduled sequence's part of the step (its rows, how its new tokens came, what
they are), the plain draws from those rows, and after the pass what each part advances in
the caches.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.batch import ForwardBatch
from engine.block_manager import BlockManager
from engine.logprobs import token_logprobs
from engine.penalties import History
from engine.sampler import sample
from engine.sequence import ScheduledSeq, Sequence
from engine.speculative.proposer import Proposer
from engine.speculative.verify import Verdict
from engine.trace.capture import PassCapture


@dataclass
class EngineStats:
    target_passes: int = 0  # forward passes of the target model
    generated_tokens: int = 0
    spec_proposed: int = 0
    spec_accepted: int = 0
    prefix_queried_tokens: int = 0  # tokens of admitted sequences looked up in the prefix cache
    prefix_hit_tokens: int = 0  # of those, found there


@dataclass(slots=True)
class SeqStep:
    """One scheduled sequence's part of a step: where its logits are among those the pass
    returns, how its new tokens came (a plain draw or a verified round) and what they are."""
    scheduled: ScheduledSeq
    rows: tuple[int, int] | None = None  # its logit rows [lo, hi); None: samples nothing (a prefill chunk)
    lens_row: int | None = None  # a logit lens: its first lens row (its j-th token reads lens_row + j)
    draw: int | None = None  # a plain draw: its index among the step's draws (its filtered logits in knobs)
    verdict: Verdict | None = None  # a speculative round: what verification kept
    spec_details: dict | None = None  # a traced round: the proposer's description of it (Proposer.describe)
    # params.prompt_logprobs: (first logit row, first position, count) of the prompt positions this
    # chunk computes whose next token is a prompt token; their rows follow every sampled row
    prompt_rows: tuple[int, int, int] | None = None
    tokens: list[int] = field(default_factory=list)  # the new tokens, in order


@dataclass
class StepPass:
    """One step's forward pass: its inputs and captures, the logits, each sequence's part."""
    parts: list[SeqStep]  # one per scheduled sequence, in batch order
    batch: ForwardBatch
    capture: PassCapture | None
    logits: torch.Tensor
    sampled: list[SeqStep] = field(default_factory=list)  # those with new tokens, in the order appended
    knobs: dict[int, dict] = field(default_factory=dict)  # a traced draw's filtered logits, shown by `sample`
    rounds: bool = False  # some sequence verified a speculative round
    number: int = 0  # the engine's step count (the events of this step carry it)


def logit_rows(scheduled: list[ScheduledSeq], batch: ForwardBatch,
               capture: PassCapture | None) -> tuple[list[SeqStep], list[int]]:
    """Each sequence's part, and the flat rows of the batch whose logits the pass returns."""
    parts, rows = [], []
    for b, s in enumerate(scheduled):
        part = SeqStep(s)
        if s.samples:
            first = batch.query_starts[b + 1] - 1 - s.num_draft
            part.rows = (len(rows), len(rows) + s.num_draft + 1)
            rows.extend(range(first, first + s.num_draft + 1))
        parts.append(part)
    _mark_prompt_rows(parts, rows, batch.query_starts)
    if capture is not None:
        _mark_lens(parts, rows, capture)
    return parts, rows


def _mark_prompt_rows(parts: list[SeqStep], rows: list[int], query_starts: list[int]) -> None:
    """The flat rows of the prompt positions whose logits score the next prompt token, for
    sequences that ask for prompt logprobs, appended to `rows` (after every sampled row)."""
    for b, part in enumerate(parts):
        s = part.scheduled
        if s.seq.params.prompt_logprobs is None:
            continue
        end = min(s.start + s.num_tokens, s.seq.num_prompt_tokens - 1)  # position P-1 predicts the first output
        if end > s.start:
            part.prompt_rows = (len(rows), s.start, end - s.start)
            rows.extend(range(query_starts[b], query_starts[b] + end - s.start))


def keep_prompt_logprobs(part: SeqStep, logits: torch.Tensor) -> None:
    """Each computed prompt position's log-probabilities of the prompt's next token, kept on
    the sequence by position (a preempted sequence recomputes them: the same values again)."""
    lo, pos, n = part.prompt_rows
    seq = part.scheduled.seq
    targets = seq.prompt_token_ids[pos + 1:pos + 1 + n]
    for j, lp in enumerate(token_logprobs(logits[lo:lo + n], targets, seq.params.prompt_logprobs)):
        seq.prompt_logprobs[pos + 1 + j] = lp


def _mark_lens(parts: list[SeqStep], rows: list[int], capture: PassCapture) -> None:
    """Mark the sampled rows of sequences with a logit lens: the flat rows the model keeps
    (capture.lens_rows), where they are among the returned rows (lens_out_rows), and each
    sequence's first lens row (logit_lens.rows reads them)."""
    flat = []
    for part in parts:
        c = part.scheduled.seq.capture
        if part.rows is not None and c is not None and c.logit_lens:
            lo, hi = part.rows
            part.lens_row = len(flat)
            flat.extend(rows[lo:hi])
            capture.lens_out_rows.extend(range(lo, hi))  # where the pass returns their logits
    if flat:
        capture.lens_rows = flat  # (a list: a whole batch's rows need no index tensor)
        capture.lens_later = True  # the lens after the step, from these rows (engine/trace/lens_queue.py)


def advance_caches(s: ScheduledSeq, verdict: Verdict | None, bm: BlockManager, speculator: Proposer | None) -> None:
    """After the pass: advance what is computed, roll back rejected speculative positions in
    both caches, and offer full blocks to the prefix cache."""
    seq = s.seq
    old = seq.num_computed_tokens
    if verdict is None:
        seq.num_computed_tokens += s.num_tokens
        bm.truncate(seq, seq.num_computed_tokens)  # proposals dropped: their blocks too
        bm.commit_full_blocks(seq, old)
        return
    real_len = len(seq)
    seq.num_computed_tokens = s.start + 1 + verdict.accepted
    bm.truncate(seq, seq.num_computed_tokens)
    kept = seq.token_ids + s.draft_tokens[:verdict.accepted]
    bm.commit_full_blocks(seq, old, kept)
    speculator.accept(seq, real_len, verdict.accepted, kept)  # counted after the commit (engine/speculation.py)


def draw_plain(step: StepPass, eos_token_ids: list[int]) -> list[SeqStep]:
    """One plain draw for every sampling sequence without proposals, all drawn together ->
    their parts, each with its token."""
    draws = [p for p in step.parts if p.rows is not None and not p.scheduled.num_draft]
    if not draws:
        return draws
    rows = [p.rows[0] for p in draws]
    seqs = [p.scheduled.seq for p in draws]
    logits = step.logits
    # every row a plain draw (no speculation this step): the logits as they are, not a copy
    picks = sample(logits if rows == list(range(len(logits))) else logits[rows],
                   [s.params for s in seqs], [s.generator for s in seqs],
                   step.knobs if any(s.traced for s in seqs) else None,
                   [draw_history(s, eos_token_ids) if s.params.adjusts_logits else None for s in seqs])
    for i, (p, token) in enumerate(zip(draws, picks)):
        p.draw, p.tokens = i, [token]
    return draws


def draw_history(seq: Sequence, eos_token_ids: list[int]) -> History:
    """What penalties, biases and min_tokens read of seq before its draw (a penalties History)."""
    p = seq.params
    stops = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids))
    return History(seq.prompt_token_ids, seq.output_token_ids, stops, seq.grammar)


def pass_made(s: ScheduledSeq) -> int:
    """How many answer tokens a pass's sequence had made once the pass ran (trace.truncated's)."""
    return max(0, s.start + s.num_tokens - s.num_draft - s.seq.num_prompt_tokens)


def token_source(verdict: Verdict | None, j: int) -> str:
    """Where a step's j-th new token came from: a plain draw from the target, an accepted
    draft proposal, the draw from max(0, p - q) after a rejection, or the bonus draw."""
    if verdict is None:
        return "target"
    if j < verdict.accepted:
        return "draft"
    return "bonus" if verdict.accepted == len(verdict.target_probs) else "corrected"
