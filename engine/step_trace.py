"""The step's trace: the events a step gives its traced requests, built from what the step
already computed (trace.events makes each event; this module says when, and
from which parts of the step).

In step order: a request's arrival and tokens (before its first step); the pass (the
schedule, a sharded step's collectives, where each sequence's K/V went, the proposer's
account of a round) before the commit; each new token's distribution and logit lens as it
is appended (the lens itself computed
after the step: LensQueue); after the commit, what the step kept of a `full` trace's captures (embedding
rows, attention, MoE routing) and of each round; last, the step's `finish` events, so a
trace's captures come before its end. A reader may cut a request's captures from inside a
step (stop_captures): that state lives here too. Apart from the engine's loop so that the
loop reads as its phases; with tracing off none of this runs but begin and end. Each
traced step ends with `schedule.traced`: what its tracing cost the engine's thread.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from engine.code_ran import attention_path, moe_path, ways_key
from engine.config import ModelConfig
from engine.sampler import explain
from engine.scheduler import Scheduler
from engine.block_manager import BlockManager
from engine.sequence import ScheduledSeq, Sequence
from engine.speculative.proposer import Proposer
from engine.speculative.verify import Verdict
from engine.step_pass import SeqStep, StepPass
from engine.tokenizer import Tokenizer
from engine.trace import events, logit_lens
from engine.trace.lens_queue import LensQueue, LensWork
from engine.trace.capture import PassCapture
from engine.trace.costs import TraceCosts
from engine.trace.events import Event
from engine.trace.softmax_stats import by_kernel, first_candidates, softmax_stats
from engine.trace.tracer import CaptureConfig

# seconds of lens work after a step for requests that finished earlier: while others run a
# kernel call or so (their next token waits for it), and with nothing to run a longer slice
# (a request that arrives meanwhile waits at most that)
BUSY_DRAIN_S = 0.0
IDLE_DRAIN_S = 0.1


class StepTrace:
    """One engine's: the tracer's emit (the engine's, which stamps the step, or the one given), the tokenizer
    (a replay has none: pieces go into the events), the model, the runner and proposer."""

    def __init__(self, emit: Callable[..., None], tokenizer: Tokenizer, model_config: ModelConfig,
                 block_size: int, runner, speculator: Proposer | None) -> None:
        self.emit, self.tokenizer, self.model_config = emit, tokenizer, model_config
        self.block_size, self.runner, self.speculator = block_size, runner, speculator
        self.method = speculator.method if speculator is not None else None
        self.capture_stops: set[str] = set()  # stop_captures(): applied before the next step
        self.in_step = False  # stop_captures() from a sink inside a step: that step's captures are cut
        self.traced_now: dict[str, ScheduledSeq] = {}  # the step in progress: its traced sequences' parts
        self.held_finishes: list[tuple[Event, int]] = []  # the step's `finish` events (and step), after its captures
        self.lenses = LensQueue(runner.model)  # tokens whose logit lens waits (computed after the step)
        self.seconds = 0.0  # the step's tracing work so far (schedule.traced)
        self.total = 0.0  # every step's (and idle drain's) tracing work so far: a request's trace_clock reads it
        self._at_sample = 0.0  # `total` as the step in progress drew its tokens (its collect() included)
        self.costs = TraceCosts()  # the same work by kind, summed over steps (the watching benchmark's rows)
        self._stacked_lens: tuple[StepPass, object] | None = None  # the step's lens rows as [L, n, hidden]
        self.ways: dict[str, tuple] = {}  # the last step's traced requests -> the ways its attention and MoE ran
        self._ways_of: dict[tuple, tuple[str, str]] = {}  # ways_key -> the ways (the tests cost more than a step's events)

    def piece(self, token_id: int) -> str:
        """A token's text for the trace, special tokens included (a replay has no tokenizer);
        a piece of a character as its bytes."""
        return self.tokenizer.token_label(token_id)

    # --- around a step -------------------------------------------------------------------
    def begin(self, requests: dict[str, Sequence]) -> None:
        """Before a step: the captures cut since the last one end now."""
        for rid in self.capture_stops:
            seq = requests.get(rid)
            if seq is not None:
                seq.capture = None
        self.capture_stops.clear()
        self.in_step = True
        self.seconds = 0.0

    def end(self) -> None:
        """After a step (or its failure): a slice of the lenses of requests that finished in
        earlier steps (drain), what the step's tracing cost, then the `finish` events it held
        (one whose lenses still wait is held on until they are out: its client was told now)."""
        t = time.perf_counter()
        finishes, self.held_finishes = self.held_finishes, []
        self.drain(BUSY_DRAIN_S)
        traced, self.traced_now, self._stacked_lens = bool(self.traced_now), {}, None
        self.in_step = False
        if traced:
            self.seconds += time.perf_counter() - t
            self.total += self.seconds
            self.emit(events.schedule_traced(self.seconds, self.lenses.take_seconds()))
        else:  # (an untraced step's drain: no traced step of its own to say it)
            self.total += self.lenses.take_seconds()
        for event, step in finishes:
            if not self.lenses.end(event[1], event, step):
                self.emit(event, step)

    def finish(self, event: Event, step: int) -> None:
        """A request's `finish`: in a step, after what the step kept (a trace's captures come
        before its end); after its lenses, where some still wait."""
        if self.in_step:
            self.held_finishes.append((event, step))
        elif not self.lenses.end(event[1], event, step):
            self.emit(event, step)

    def waiting(self) -> bool:
        """Finished requests' lenses still wait (the engine has work though no request runs)."""
        return bool(self.lenses.ended)

    def drain(self, seconds: float) -> None:
        """The waiting lenses of finished requests, oldest request first, a kernel call at a
        time until `seconds` are spent (one call at least); each request's `finish` event as
        soon as its last lens is out."""
        t = time.perf_counter()
        ended = self.lenses.ended
        if not ended:
            return
        while ended:
            rid = next(iter(ended))
            self._emit_lenses(self.lenses.slice(rid, self.lenses.one_call(rid)))
            if not self.lenses.pending.get(rid):
                self.lenses.pending.pop(rid, None)
                done = ended.pop(rid)
                self.emit(done.event, done.step)
            if time.perf_counter() - t >= seconds:
                break
        self.costs.since("logit lens", t)

    def idle(self, busy: bool) -> bool:
        """Between steps with nothing to run (not busy): a slice of the waiting lenses instead
        of a step; True if that is what this call did."""
        if busy or not self.lenses.ended:
            return False
        t = time.perf_counter()
        with torch.inference_mode():
            self.drain(IDLE_DRAIN_S)
        self.lenses.take_seconds()  # (no step's: counted here, not in the next step's schedule.traced)
        self.total += time.perf_counter() - t
        return True

    def stop_captures(self, seq: Sequence | None, request_id: str, limit_bytes: int, step_count: int) -> bool:
        """LLMEngine.stop_captures: the request's captures cut from the next pass on (or from
        the one in progress, where it is in it), and the `trace.truncated` event that says so."""
        self.lenses.pending.pop(request_id, None)  # its waiting lenses too: the reader keeps no more captures
        # (a request that finished in the step in progress still has that step's captures to cut)
        if seq is None or not seq.traced or \
                (seq.is_finished and not (self.in_step and request_id in self.traced_now)):
            return False
        self.capture_stops.add(request_id)
        s = self.traced_now.get(request_id) if self.in_step else None
        if s is None:  # between steps: the next pass is the first without captures
            position, step = len(seq) - 1, step_count + 1
        else:  # the pass in progress (its captures are cut from here on): where its rows begin
            position, step = s.start, step_count
        made = max(0, s.start + s.num_tokens - s.num_draft - seq.num_prompt_tokens) if s else seq.num_output_tokens
        self.emit(events.trace_truncated(request_id, limit_bytes, step, position, made))
        return True

    def _way(self, step: StepPass) -> tuple[str, str]:
        """The ways this pass's attention and MoE ran (code_ran), said only where they
        are news to a traced request in it (its last step was not the one before, or ran another
        way): a reader carries a request's ways on through its steps, a decode step pays no bytes."""
        model, batch, dtype = self.runner.model, step.batch, self.runner.dtype
        key = ways_key(model, batch, dtype)
        ways = self._ways_of.get(key)
        if ways is None:
            ways = self._ways_of[key] = (attention_path(model, batch, dtype), moe_path(model, batch, dtype))
        news = any(self.ways.get(rid) != ways for rid in self.traced_now)
        self.ways = dict.fromkeys(self.traced_now, ways)
        return ways if news else ("", "")

    # --- the events, in step order ---------------------------------------------------------
    def arrival(self, seq: Sequence, messages: list[dict] | None) -> None:
        seq.trace_clock.append(self.total)
        self.emit(events.request_arrive(seq, messages))
        self.emit(events.tokenize(seq, self.tokenizer.pieces(seq.prompt_token_ids), self.model_config.vocab_size,
                                  self.tokenizer.vocab_size, messages is not None))

    def step_pass(self, step: StepPass, scheduler: Scheduler, bm: BlockManager, forward_seconds: float,
                  phases: dict) -> None:
        """The pass: the step's schedule (and a sharded step's collectives), where each traced
        sequence's K/V went, and what the proposer says of each round. Before the commit: it
        rolls rejected proposals' blocks back, and kv.fill shows them written."""
        t = time.perf_counter()
        scheduled = [p.scheduled for p in step.parts]
        self.traced_now = {s.seq.request_id: s for s in scheduled if s.seq.traced}
        # the runner's collect() ran inside the pass's time: the trace's work, not the engine's
        collected = step.capture.collect_costs.total() if step.capture is not None else 0.0
        forward_seconds, self.seconds = forward_seconds - collected, self.seconds + collected
        self._at_sample = self.total + collected  # (the earlier steps' work all came before this step's draws)
        runner = self.runner
        if runner.placement is not None:  # sharded: what crossed between the ranks (engine/parallel)
            self.emit(events.schedule_collective(scheduled, runner.placement.as_dict(), runner.trace_events(),
                                                 forward_seconds))
        self.emit(events.schedule_step(scheduled, phases, forward_seconds, step.batch.query_starts[-1],
                                       len(scheduler.running), len(scheduler.waiting),
                                       bm.num_free_blocks, bm.num_cached_blocks, *self._way(step)))
        fills = self.costs.since("schedule", t)
        for s in scheduled:
            if s.seq.traced:
                self.emit(events.kv_fill(s, self.block_size))
        rounds = self.costs.since("kv fills", fills)
        for p in step.parts:  # what the proposer says of a round, read before the commit moves the sequence on
            if p.verdict is not None and p.scheduled.seq.traced:
                p.spec_details = self.speculator.describe(p.scheduled.seq, self.piece)
        now = time.perf_counter()
        if self.speculator is not None:
            self.costs.seconds["speculation"] += now - rounds
        self.seconds += now - t

    def token(self, step: StepPass, part: SeqStep, j: int, token: int, config: CaptureConfig) -> None:
        """The target's distribution at the part's j-th new token's position (its top candidates),
        and its logit lens (queued: LensQueue)."""
        t = time.perf_counter()
        seq, row = part.scheduled.seq, step.logits[part.rows[0] + j]
        seq.trace_clock.append(self._at_sample)
        top = seq.capture.logit_lens if part.lens_row is not None else 0
        # the model's own row, read once for both the sample event and (its first `top`) the lens
        stats = softmax_stats(row[None], max(top, config.top_candidates), [token]) \
            if top and by_kernel(row[None]) else None
        info = explain(row, seq.params, token, config.top_candidates, step.knobs.get(part.draw), stats)
        source = token_source(part.verdict, j)
        method = self.method if source != "target" else None
        self.emit(events.sample(seq, source, method, token, info, self.piece))
        lens = self.costs.since("sampling", t)
        if part.lens_row is not None:
            # the model's own row: the sampler's distribution
            own = first_candidates(stats, top) if stats is not None else softmax_stats(row[None], top, [token])
            rows = self._lens_rows(step)[:, part.lens_row + j].clone()  # [L, hidden], freed with the step's
            self._emit_lenses(self.lenses.keep(LensWork(seq, step.number, len(seq), source, token, top, rows, own),
                                               config.lens_live_seconds))
        self.seconds += self.costs.since("logit lens", lens) - t

    def _lens_rows(self, step: StepPass) -> torch.Tensor:
        """The step's kept residual stream [L, lens rows, hidden] (stacked once a step)."""
        if self._stacked_lens is None or self._stacked_lens[0] is not step:
            self._stacked_lens = (step, logit_lens.kept_rows(step.capture, len(step.capture.lens_out_rows)))
        return self._stacked_lens[1]

    def _emit_lenses(self, works: list[LensWork]) -> None:
        """The `logit_lens` events of these tokens, computed now (batched), in their order."""
        if not works:
            return
        with torch.inference_mode():
            stats = self.lenses.compute(works)
        for w, s in zip(works, stats):
            self.emit(events.logit_lens_of(w.seq.request_id, w.position, w.source, w.token, s, self.piece), w.step)

    def round(self, part: SeqStep, kept: int, proposed: int) -> None:
        """A speculative round as the commit counted it: the tokens its sequence kept."""
        t = time.perf_counter()
        self.emit(events.spec(part.scheduled, part.verdict, self.piece, part.spec_details or {}, kept, proposed))
        self.seconds += self.costs.since("speculation", t) - t

    def captures(self, step: StepPass) -> None:
        """After the commit: a `full` trace's captures of the rows that read a token the
        sequence kept. None of a rejected proposal (that row read a token the position does
        not hold), none past an end of sequence (a round that ended early read positions the
        sequence never has); the newest token is never read: no pass has it as an input."""
        t = time.perf_counter()
        for kind, seconds in step.capture.collect_costs.seconds.items():  # (the runner's, in the pass's time)
            self.costs.seconds[kind] += seconds
        for b, part in enumerate(step.parts):
            s = part.scheduled
            seq = s.seq
            if seq.traced and seq.capture is not None:
                self._captures_of(step.capture, b, s, min(s.start + s.num_tokens, len(seq) - 1))
        self.seconds += time.perf_counter() - t

    def _captures_of(self, capture: PassCapture, b: int, s: ScheduledSeq, end: int) -> None:
        """Sequence b's embedding rows, attention and MoE routing, of positions before `end`
        (each kind's cost apart: TraceCosts)."""
        cfg, spec = self.model_config, s.seq.capture
        t = time.perf_counter()
        if b in capture.embed:
            self._emit_capture(events.embed(s, capture.embed[b], cfg.hidden_size, end, spec.compact))
            t = self.costs.since("embedding rows", t)
        heads = spec.heads if spec.heads is not None else list(range(cfg.num_heads))
        if b in capture.attention:
            self._emit_capture(events.attention(s, capture.attention[b], heads, cfg, end, spec.compact))
            t = self.costs.since("attention", t)
        for layer, per_seq in capture.moe.items():
            if b in per_seq:
                self._emit_capture(events.moe(s, layer, per_seq[b], capture.expert_load[layer], cfg, end))
        self.costs.since("moe routing", t)

    def _emit_capture(self, event: Event | None) -> None:
        if event is not None:  # (None: nothing captured of this kind for these positions)
            self.emit(event)


def token_source(verdict: Verdict | None, j: int) -> str:
    """Where a step's j-th new token came from: a plain draw from the target, an accepted
    draft proposal, the draw from max(0, p - q) after a rejection, or the bonus draw."""
    if verdict is None:
        return "target"
    if j < verdict.accepted:
        return "draft"
    return "bonus" if verdict.accepted == len(verdict.target_probs) else "corrected"
