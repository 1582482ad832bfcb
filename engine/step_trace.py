"""The step's trace: the events a step gives its traced requests, built from what the step
already computed (trace.events makes each event; this module says when, and
from which parts of the step).

In step order: a request's arrival and tokens (before its first step); the pass (the
schedule, a sharded step's collectives, where each sequence's K/V went, the proposer's
account of a round) before the commit; each new token's distribution and logit lens as it
is appended (the lens itself computed
after the step: LensQueue); after the commit, what the step kept of a `full` trace's captures (embedding
rows, attention, MoE routing) and of each round; last, the step's `finish` events, so a
trace's captures come before its end. At level `full` a token's distribution and the pass's
captures are built live only for a request's step whose lens is live: the others are kept
(CaptureQueue) and built after its last token, before its `finish`. A reader may cut a request's captures from inside a
step (stop_captures): that state lives here too. Apart from the engine's loop so that the
loop reads as its phases; with tracing off none of this runs but begin and end. Each
traced step ends with `schedule.traced`: what its tracing cost the engine's thread.
"""
from __future__ import annotations

import time
from functools import partial
from typing import Callable

import torch

from engine.code_ran import attention_path, first_layer, moe_path, ways_key
from engine.config import ModelConfig
from engine.sampler import explain
from engine.scheduler import Scheduler
from engine.block_manager import BlockManager
from engine.sequence import ScheduledSeq, Sequence
from engine.speculative.proposer import Proposer
from engine.step_pass import SeqStep, StepPass, pass_made, token_source
from engine.tokenizer import Tokenizer
from engine.trace import events, logit_lens
from engine.trace.capture_queue import CaptureQueue, Later
from engine.trace.lens_queue import Ended, LensQueue, LensWork
from engine.trace.capture import PassCapture
from engine.trace.costs import TraceCosts
from engine.trace.deferred import DRAIN_ITEMS, Deferred
from engine.trace.events import Event
from engine.trace.moe_lists import MoeLists
from engine.trace.softmax_stats import by_kernel, first_candidates, softmax_stats
from engine.trace.tracer import CaptureConfig

# seconds of lens work after a step for requests that finished earlier: while others run a
# kernel call or so (their next token waits for it), and with nothing to run a longer slice
# (a request that arrives meanwhile waits at most that)
BUSY_DRAIN_S = 0.0
IDLE_DRAIN_S = 0.1
DRAIN_EVENTS = 16  # a finished request's waiting events built a drain call at a time


class StepTrace:
    """One engine's: the tracer's emit (the engine's, which stamps the step, or the one given), the tokenizer
    (a replay has none: pieces go into the events), the model, the runner and proposer, and what says a
    step's tokens end their request (its last step is live: last_step)."""

    def __init__(self, emit: Callable[..., None], tokenizer: Tokenizer, model_config: ModelConfig,
                 block_size: int, runner, speculator: Proposer | None,
                 ends: Callable[[Sequence, list[int]], bool] | None = None) -> None:
        self.emit, self.tokenizer, self.model_config = emit, tokenizer, model_config
        self.ends = ends  # whether a step's tokens surely end their request (OutputProcessor.surely_ends)
        self.block_size, self.runner, self.speculator = block_size, runner, speculator
        self.method = speculator.method if speculator is not None else None
        self.capture_stops: set[str] = set()  # stop_captures(): applied before the next step
        self.in_step = False  # stop_captures() from a sink inside a step: that step's captures are cut
        self.traced_now: dict[str, ScheduledSeq] = {}  # the step in progress: its traced sequences' parts
        self.held_finishes: list[tuple[Event, int]] = []  # the step's `finish` events (and step), after its captures
        self.lenses = LensQueue(runner.model)  # tokens whose logit lens waits (computed after the step)
        self.later = CaptureQueue()  # a `full` trace's per-token events, not built yet
        self.live: dict[str, bool] = {}  # the step in progress: request id -> its events built live?
        self.cut: set[str] = set()  # requests whose captures a reader cut (their waiting ones are not emitted)
        self.emitting: tuple[str, int, tuple] | None = None  # a later event being emitted: request, step, where
        self.seconds = 0.0  # the step's tracing work so far (schedule.traced)
        self.total = 0.0  # every step's (and idle drain's) tracing work so far: a request's trace_clock reads it
        self._at_sample = 0.0  # `total` as the step in progress drew its tokens (its collect() included)
        self.costs = TraceCosts()  # the same work by kind, summed over steps (the watching benchmark's rows)
        self._stacked_lens: tuple[StepPass, object] | None = None  # the step's lens rows as [L, n, hidden]
        self.ways: dict[str, tuple] = {}  # the last step's traced requests -> the ways its attention and MoE ran
        self._ways_of: dict[tuple, tuple[str, str]] = {}  # ways_key -> the ways (the tests cost more than a step's events)
        self._first: tuple = (None, None)  # the runner's model and its first layer (ways_key reads it)
        self.deferred = Deferred()  # the keeping of steps that were not live, not done yet (flush)
        cfg = model_config  # what a deferred token holds (its logits and lens rows), and a pass's attention a row-key
        self._token_bytes = 4 * (cfg.vocab_size + cfg.num_layers * cfg.hidden_size)
        self._pass_bytes = 4 * cfg.num_layers * cfg.num_heads

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
        self.live.clear()
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
            self._end(event, step)

    def finish(self, event: Event, step: int) -> None:
        """A request's `finish`: in a step, after what the step kept (a trace's captures come
        before its end); after its lenses and waiting events, where some still wait."""
        if self.in_step:
            self.held_finishes.append((event, step))
        else:
            self._end(event, step)

    def _end(self, event: Event, step: int) -> None:
        """The `finish` event now, or (held) once the request's waiting lenses and events (and their
        deferred keeping) are out."""
        rid = event[1]
        self.later.end(rid)
        deferred = self.deferred.end(rid)
        if self.lenses.end(rid, event, step):
            return
        if deferred or self.later.waits(rid):
            self.lenses.ended[rid] = Ended(event, step)
            return
        self.cut.discard(rid)
        self.emit(event, step)

    def waiting(self) -> bool:
        """Finished requests' lenses still wait (the engine has work though no request runs)."""
        return bool(self.lenses.ended)

    def drain(self, seconds: float) -> None:
        """The waiting lenses and events of finished requests, oldest request first, a kernel
        call's lenses (after their steps' events; without lenses DRAIN_EVENTS events) at a time
        until `seconds` are spent (one call at least); each request's `finish` event as soon
        as its last lens and event are out."""
        ended = self.lenses.ended
        if not ended:
            return
        t = time.perf_counter()
        while ended:
            rid = next(iter(ended))
            if rid in self.deferred.ended:  # its deferred keeping first, a slice at a time
                with torch.inference_mode():
                    self.deferred.run_ended(rid, DRAIN_ITEMS)
            else:  # a kernel call's lenses with the events of their steps (without lenses, a chunk of events)
                works = self.lenses.slice(rid, self.lenses.one_call(rid)) if self.lenses.pending.get(rid) else []
                self._emit_later(rid, self.later.take_until(rid, works[-1].step) if works else
                                 self.later.take(rid, DRAIN_EVENTS), works)
            if rid not in self.deferred.ended and not self.lenses.pending.get(rid) and not self.later.waits(rid):
                self.lenses.pending.pop(rid, None)
                done = ended.pop(rid)
                self.cut.discard(rid)
                self.emit(done.event, done.step)
            if time.perf_counter() - t >= seconds:
                break

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
        self.flush()
        lenses = self.lenses.pending.pop(request_id, [])  # its waiting lenses too: the reader keeps no more
        waited = self.later.stop(request_id)  # and its waiting captures (its `sample` events still come)
        dropped = {w.step for w in lenses} | {x.step for x in waited if x.captured}
        self.cut.add(request_id)
        if self.emitting is not None and self.emitting[0] == request_id:  # an event built after its step,
            _, step, where = self.emitting  # or a lens: the captures cut from that pass on
            if seq is not None and not seq.is_finished:
                self.capture_stops.add(request_id)
            self.emit(events.trace_truncated(request_id, limit_bytes, step, *where), step)
            return True
        # its captures end where the oldest dropped one was, not at the next pass (a deferred
        # step's `sample` waits too, with where its pass began)
        x = next((x for x in waited if dropped and x.step == min(dropped)), None)
        if x is not None:
            if seq is not None and not seq.is_finished:
                self.capture_stops.add(request_id)
            self.emit(events.trace_truncated(request_id, limit_bytes, x.step, *x.where))
            return True
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
        made = pass_made(s) if s else seq.num_output_tokens
        self.emit(events.trace_truncated(request_id, limit_bytes, step, position, made))
        return True

    def _way(self, step: StepPass) -> tuple[str, str]:
        """The ways this pass's attention and MoE ran (code_ran), said only where they
        are news to a traced request in it (its last step was not the one before, or ran another
        way): a reader carries a request's ways on through its steps, a decode step pays no bytes."""
        model, batch, dtype = self.runner.model, step.batch, self.runner.dtype
        if self._first[0] is not model:
            self._first = (model, first_layer(model))
        key = ways_key(model, self._first[1], batch, dtype)
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
        collected = self.costs.add(step.capture.collect_costs) if step.capture is not None and \
            not step.capture.pending else 0.0
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
        and its logit lens (queued: LensQueue). At level `full` both wait (CaptureQueue, LensQueue)
        unless the step is live: the step keeps the logits row, and, where it is not live, even
        the queueing waits (deferred)."""
        t = time.perf_counter()
        seq = part.scheduled.seq
        if j == 0 and self.ends is not None and self.ends(seq, part.tokens):  # its last step: shown at once
            self.last_step(seq, config)
        live = seq.capture is None or self._live(seq, config)  # (level basic: no tensors kept, its event now)
        seq.trace_clock.append(self._at_sample)
        if live:
            self._token(step, part, j, token, config, len(seq), True)
        else:
            self._defer(seq.request_id, self._token_bytes, self._token, step, part, j, token, config, len(seq),
                        False)
        self.seconds += time.perf_counter() - t

    def _token(self, step: StepPass, part: SeqStep, j: int, token: int, config: CaptureConfig, position: int,
               live: bool) -> None:
        """token()'s work, at the step or (not live) when the deferred work is flushed: position,
        the sequence's length when the token was drawn."""
        t = time.perf_counter()
        seq, row = part.scheduled.seq, step.logits[part.rows[0] + j]
        if step.capture is not None:
            self._ready(step.capture)
        source = token_source(part.verdict, j)
        if not live and step.logits.shape[0] > 1:  # (one row: the step's own tensor, kept whole)
            row = row.clone()
        work = None
        if part.lens_row is not None:
            rows = self._lens_row(step, part.lens_row + j)  # [L, hidden]
            work = LensWork(seq, step.number, position, source, token, seq.capture.logit_lens, rows, None, row,
                            (part.scheduled.start, pass_made(part.scheduled)))
        build = partial(self._sample_event, seq, position, source, self.method if source != "target" else None,
                        token, row, step.knobs.get(part.draw), config.top_candidates, work)
        self._keep(seq.request_id, live, build, step.number, row.nbytes, part.scheduled, "sampling")
        lens = time.perf_counter()
        if work is not None:
            self._emit_lenses(self.lenses.keep(work, config.lens_live_seconds, live))
        self.costs.since("logit lens", lens)

    def _sample_event(self, seq: Sequence, position: int, source: str, method: str | None, token: int,
                      row: torch.Tensor, knobs: dict | None, top_c: int, work: LensWork | None) -> Event:
        """A token's `sample` event (sampler.explain of its logits row), at its position. Where
        its lens waits for the own row's stats, one softmax-stats pass over the row serves both."""
        top = work.top if work is not None and work.own is None else 0
        stats = softmax_stats(row[None], max(top, top_c), [token]) if top and by_kernel(row[None]) else None
        info = explain(row, seq.params, token, top_c, knobs, stats)
        if stats is not None:  # the model's own row: the sampler's distribution
            work.own, work.logits = first_candidates(stats, top), None
        name, rid, data = events.sample(seq, source, method, token, info, self.piece)
        data["position"] = position
        return name, rid, data

    def last_step(self, seq: Sequence, config: CaptureConfig) -> None:
        """The request's last token comes in this step (known before it is appended): where its
        newest lens is live while it runs, this step is live too, so a page shows its last pass at
        once, not after the lenses of the tokens before it (computed after its end, oldest first)."""
        if config.lens_live_seconds is not None:
            self.live[seq.request_id] = True

    def _live(self, seq: Sequence, config: CaptureConfig) -> bool:
        """Whether this step builds the request's events now: decided at its first need in the
        step, by the lens's rule where it has a lens (so the newest lens's pass has every capture)."""
        rid = seq.request_id
        live = self.live.get(rid)
        if live is None:
            if seq.capture is not None and seq.capture.logit_lens:
                live = self.lenses.due(rid, config.lens_live_seconds)
            else:
                live = self.later.due(rid, config.lens_live_seconds)
            self.live[rid] = live
        return live

    def _keep(self, request_id: str, live: bool, build, step: int, nbytes: int, s: ScheduledSeq,
              kind: str) -> None:
        """An event of the step, or a list of them (of s's pass; kind: its TraceCosts kind, `sampling`
        for the `sample` event, else a tensor capture): built and emitted now where live, else kept."""
        if live:
            t = time.perf_counter()
            built = build()
            for event in built if isinstance(built, list) else (built,):
                if event is not None:
                    self.emit(event)
            self.costs.since(kind, t)
            return
        self._emit_later(request_id, self.later.keep(
            request_id, Later(build, step, nbytes, (s.start, pass_made(s)), kind)))

    def _emit_later(self, request_id: str, items: list[Later], works: list[LensWork] = ()) -> None:
        """Waiting events built now and the lenses of `works` computed (after the events: a
        `sample` gives its lens the own row's stats), then emitted in step order, each stamped
        with its step (its time is now's: a trace's events come in time order); none of a cut
        request's captures, so a reader's cap met on one drops every capture after it."""
        out = []
        for x in items:
            t = time.perf_counter()
            built, key = x.build(), (x.step, 2 if x.captured else 0)
            out += [(key, x.where, e) for e in built] if isinstance(built, list) else [(key, x.where, built)]
            self.costs.since(x.kind, t)
        if works and request_id not in self.cut:
            t = time.perf_counter()
            out += [((w.step, 1), w.where, e) for w, e in zip(works, self._lens_events(works))]
            self.costs.since("logit lens", t)
        for (step, kind), where, event in sorted(out, key=lambda o: o[0]):  # (stable: a step's own order)
            if event is not None and not (kind and request_id in self.cut):
                self._emit_at(request_id, event, step, where)

    def _emit_at(self, request_id: str, event: Event, step: int, where: tuple[int, int]) -> None:
        """An event of an earlier step (or of the step's lens): stop_captures reads where its pass was."""
        self.emitting = (request_id, step, where)
        try:
            self.emit(event, step)
        finally:
            self.emitting = None

    def _lens_rows(self, step: StepPass) -> torch.Tensor:
        """The step's kept residual stream [L, lens rows, hidden] (stacked once a step)."""
        if self._stacked_lens is None or self._stacked_lens[0] is not step:
            self._stacked_lens = (step, logit_lens.kept_rows(step.capture, len(step.capture.lens_out_rows)))
        return self._stacked_lens[1]

    def _lens_row(self, step: StepPass, i: int) -> torch.Tensor:
        """Lens row i of the step's kept residual stream [L, hidden]: the pass's own tensor where
        it kept that row alone (the one-call stack's, new each pass), else a copy (the step's
        other rows are freed with it)."""
        kept = step.capture.lens_hidden
        if len(kept) == 1 and len(step.capture.lens_out_rows) == 1:
            return kept[0]
        return self._lens_rows(step)[:, i].clone()

    def _emit_lenses(self, works: list[LensWork]) -> None:
        """The `logit_lens` events of these tokens, computed now (batched), in their order."""
        for w, event in zip(works, self._lens_events(works)):
            self._emit_at(w.seq.request_id, event, w.step, w.where)

    def _lens_events(self, works: list[LensWork]) -> list[Event]:
        if not works:
            return []
        with torch.inference_mode():
            stats = self.lenses.compute(works)
        return [events.logit_lens_of(w.seq.request_id, w.position, w.source, w.token, s, self.piece)
                for w, s in zip(works, stats)]

    def round(self, part: SeqStep, kept: int, proposed: int) -> None:
        """A speculative round as the commit counted it: the tokens its sequence kept."""
        t = time.perf_counter()
        self.emit(events.spec(part.scheduled, part.verdict, self.piece, part.spec_details or {}, kept, proposed))
        self.seconds += self.costs.since("speculation", t) - t

    def captures(self, step: StepPass, config: CaptureConfig) -> None:
        """After the commit: a `full` trace's captures of the rows that read a token the
        sequence kept. None of a rejected proposal (that row read a token the position does
        not hold), none past an end of sequence (a round that ended early read positions the
        sequence never has); the newest token is never read: no pass has it as an input.
        Built now where the step is live, else kept (CaptureQueue): where not live, the keeping
        itself waits too (deferred)."""
        t = time.perf_counter()
        for b, part in enumerate(step.parts):
            s = part.scheduled
            seq = s.seq
            if seq.traced and seq.capture is not None:
                end = min(s.start + s.num_tokens, len(seq) - 1)
                if self._live(seq, config):
                    self._captures_of(step, b, s, end, True)
                else:
                    rows, spec = min(s.num_tokens, seq.capture.max_keys), seq.capture
                    self._defer(seq.request_id, self._pass_bytes * rows * spec.max_keys, self._captures_of, step, b, s,
                                end, False)
        self.seconds += time.perf_counter() - t

    def _ready(self, capture: PassCapture) -> None:
        """The pass's captures complete (what it left for their first reader: PassCapture.ready),
        collect()'s costs then added by kind (the watching benchmark's rows)."""
        if capture.ready():
            self.costs.add(capture.collect_costs)

    # --- deferred: what steps that are not live leave for later (Deferred) -----------------------------
    def _defer(self, request_id: str, nbytes: int, work: Callable, *args) -> None:
        if self.deferred.add(request_id, work, args, nbytes):
            self.flush()

    def flush(self) -> None:
        """The deferred work, in order: before anything reads the queues."""
        if not self.deferred.items and not self.deferred.ended:
            return
        t = time.perf_counter()
        with torch.inference_mode():
            self.deferred.run()
        if self.in_step:
            self.seconds += time.perf_counter() - t
        else:
            self.total += time.perf_counter() - t

    def _captures_of(self, step: StepPass, b: int, s: ScheduledSeq, end: int, live: bool) -> None:
        """Sequence b's embedding rows, attention and MoE routing, of positions before `end`
        (each kind's cost apart, when built: TraceCosts)."""
        capture, cfg, spec, rid = step.capture, self.model_config, s.seq.capture, s.seq.request_id
        self._ready(capture)
        if b in capture.embed:
            rows = capture.embed[b]
            self._keep(rid, live, partial(events.embed, s, rows, cfg.hidden_size, end, spec.compact), step.number,
                       rows.nbytes, s, "embedding rows")
        heads = spec.heads if spec.heads is not None else list(range(cfg.num_heads))
        if b in capture.attention:
            a = capture.attention[b]
            self._keep(rid, live, partial(events.attention, s, a, heads, cfg, end, spec.compact), step.number,
                       a.probs.nbytes, s, "attention")
        if spec.moe and capture.moe is not None:  # every layer's as one (lists made once for the pass)
            self._keep(rid, live, partial(moe_events, s, capture.moe, b, cfg, end), step.number, 0, s, "moe routing")


def moe_events(s: ScheduledSeq, routing: MoeLists, b: int, cfg: ModelConfig, end: int) -> list[Event]:
    """Sequence b's `moe` events, a layer's each (the pass's routing as lists: made once a pass);
    none where the pass read no position before `end`."""
    if end <= s.start:
        return []
    return [events.moe(s, layer, routing.seq(layer, b), routing.load(layer), cfg, end) for layer in routing.layers]
