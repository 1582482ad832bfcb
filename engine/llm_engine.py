"""LLMEngine: the loop that serves requests. add_request -> step() ... -> finished.

Each step, in phases (one method each): the scheduler picks a batch, the proposer (speculative decoding)
proposes draft tokens, the model runner computes the batch over the paged KV cache, the sampler draws a
token for every sequence whose prompt is computed (or the target verifies the proposals), the pass is
traced, and the step is committed: caches advanced, tokens appended and checked against the stop conditions.

Beside the loop, each in a module of its own so that the loop reads top to bottom (as vLLM v1 keeps
its input and output processors apart from its core): a request's intake (InputProcessor), what a new
token does (OutputProcessor), logit rows and plain draws (StepPass), Speculation, the trace (StepTrace).
"""
from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import torch

from engine.block_manager import BlockManager
from engine.checkpoint.resolve import load_config, resolve_model_path
from engine.config import EngineConfig, ProgressFn
from engine.info import EngineInfo, EngineLoad, describe
from engine.lane import CoreHooks, Lane, lane_load
from engine.input_processor import ContextLengthError, InputProcessor, RequestOptions, choice_ids  # noqa: F401 (re-exported)
from engine.logprobs import token_logprobs
from engine.model_runner import ModelRunner
from engine.output_processor import OutputProcessor, request_metrics, request_output
from engine.outputs import RequestOutput, TokenOutput
from engine.parallel.runner import ParallelRunner
from engine.request_table import RequestTable
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import ScheduledSeq, Sequence
from engine.speculative.proposer import Proposer, SpeculativeConfig
from engine.speculative.verify import verify
from engine.startup import freeze_startup_heap, resolve_device, resolve_dtype
from engine.speculation import Speculation
from engine.step_pass import EngineStats, StepPass, advance_caches, draw_plain, keep_prompt_logprobs, logit_rows
from engine.step_trace import StepTrace
from engine.tokenizer import Tokenizer
from engine.trace import TRACE_LEVELS, CaptureConfig, Tracer, events
from engine.trace.capture import PassCapture
from engine.trace.events import Event
from engine.trace.kv_pool import KVPoolTracker

DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "assets" / "models" / "target"
_ids = itertools.count()


class LLMEngine:
    """What a server may use is the Engine protocol (engine.engine_api), and the tracer's events;
    the rest are its parts, free to change."""

    def __init__(self, model: str | Path | None = None, *, device: str = "auto",
                 dtype: str | torch.dtype = "auto", config: EngineConfig | None = None,
                 tracer: Tracer | None = None, trace_level: str = "basic",
                 capture: CaptureConfig | None = None, progress: ProgressFn | None = None,
                 draft: str | Path | None = None, num_speculative_tokens: int = 4,
                 prompt_lookup_max: int = 4, prompt_lookup_min: int = 2, kv_pool_events: str = "traced",
                 hooks: CoreHooks | None = None) -> None:
        """draft: a draft model's path or hub id, or "ngram" for prompt lookup (proposals
        copied from the request's own tokens: the last n tokens, n from prompt_lookup_max
        down to prompt_lookup_min, are looked up earlier in the prompt and output).
        kv_pool_events: when the tracer gets `kv.pool` (KVPoolTracker): "traced"
        (while a traced request is live) or "always" (whenever the pool changes: a server
        that draws the pool for untraced requests too).
        hooks: what an engine built around this one changes of its loop (CoreHooks)."""
        self.config, self.hooks = config or EngineConfig(), hooks or CoreHooks()
        self.model_path = resolve_model_path(model if model is not None else DEFAULT_MODEL)
        self.model_config = cfg = load_config(self.model_path)
        self.tokenizer = Tokenizer(self.model_path)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, cfg.torch_dtype, self.device)
        self.max_model_len = min(self.config.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
        # a draft that cannot serve fails before any weights load
        spec = SpeculativeConfig.resolve(draft, num_speculative_tokens, prompt_lookup_max, prompt_lookup_min,
                                         self.tokenizer, cfg)
        if spec is not None and spec.max_positions is not None:
            self.max_model_len = min(self.max_model_len, spec.max_positions)
        sharded = self.config.tensor_parallel_size > 1 or self.config.expert_parallel  # over ranks
        runner_cls = ParallelRunner if sharded else ModelRunner
        self.runner = runner_cls(self.model_path, cfg, self.config, self.max_model_len, self.dtype, self.device,
                                 progress)
        self.tracer = tracer
        if trace_level not in TRACE_LEVELS:
            raise ValueError(f"trace_level must be one of {TRACE_LEVELS}")
        self.default_trace_level = trace_level if tracer is not None else "off"
        self.capture = capture or CaptureConfig()
        self.block_manager = BlockManager(self.runner.num_blocks, self.config.block_size,
                                          self.config.enable_prefix_caching, emit=self.emit if tracer is not None else None)
        self.num_speculative_tokens = num_speculative_tokens
        # proposes the tokens each round verifies: a draft model beside the target, or n-grams
        self.speculator: Proposer | None = None if spec is None else spec.build(
            self.config, self.runner.num_blocks, self.max_model_len, cfg.vocab_size, self.dtype, self.device, progress)
        self.speculative_method = self.speculator.method if self.speculator is not None else None
        self.speculation = None if self.speculator is None else Speculation(
            self.speculator, num_speculative_tokens, self.max_model_len, self.config.max_num_batched_tokens)
        self.scheduler = self.hooks.new_scheduler(self.block_manager) if self.hooks.new_scheduler else \
            Scheduler(self.config, self.block_manager, self.speculation and self.speculation.lookahead)
        self.intake = InputProcessor(self.tokenizer, cfg, self.max_model_len, self.runner.num_blocks, self.config.block_size,
                                     self.device, num_speculative_tokens, self.speculator is not None)
        self.output = (self.hooks.output_processor or OutputProcessor)(cfg.eos_token_ids, self.max_model_len, self.emit)
        self.step_trace = StepTrace(self.emit, self.tokenizer, cfg, self.config.block_size, self.runner,
                                    self.speculator, self.output.surely_ends)
        self.requests = RequestTable()  # live, and finished ones until released
        self._outputs_for_next_step: list[TokenOutput] = []  # made between steps (aborts): the next step returns them
        self.step_count, self.num_aborted = 0, 0
        self.stats = EngineStats()
        self.lock = threading.RLock()  # add/abort may come from other threads than step()
        # a lock is not fair (step() after step() may take it again first): an abort waiting goes first
        self._aborting, self._no_abort_waits, self._abort_count_lock = 0, threading.Event(), threading.Lock()
        self._no_abort_waits.set()
        self._info: EngineInfo | None = None  # describe(), built on first use
        if kv_pool_events not in ("traced", "always"):
            raise ValueError("kv_pool_events must be 'traced' or 'always'")
        self.lane = Lane(self.scheduler, self.block_manager, self.runner,
                         KVPoolTracker(always=kv_pool_events == "always"))  # the parts a step runs on
        if self.config.freeze_startup_heap:
            freeze_startup_heap()

    # --- requests ----------------------------------------------------------------
    def add_request(self, prompt: str | list[int] | None = None, params: SamplingParams | None = None, *,
                    messages: list[dict] | None = None, request_id: str | None = None,
                    trace_level: str | None = None, speculative: bool = True,
                    num_speculative_tokens: int | None = None, context_fit: str = "run") -> str:
        """Queue a request; returns its id. With speculation on, `speculative=False` turns
        speculative decoding off for this request and `num_speculative_tokens` sets its k
        (at most the engine's). context_fit: what a max_tokens past the context does: "run"
        (generate until the context is full, finish reason length), "lower" (max_tokens
        lowered to the room left, as the trace's params then say) or "refuse"
        (ContextLengthError). The prompt is tokenized and checked here, once."""
        arrival = time.perf_counter()
        level = trace_level or self.default_trace_level
        if level not in TRACE_LEVELS:
            raise ValueError(f"trace level must be one of {TRACE_LEVELS}")
        request_id = request_id or f"req-{next(_ids)}"
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        opts = RequestOptions(request_id, level if self.tracer is not None else "off", speculative,
                              num_speculative_tokens, context_fit, arrival, self.capture)
        seq = self.intake.sequence(prompt, params or SamplingParams(), messages, opts)
        with self.lock:
            for s in [seq] + seq.forks:
                if s.request_id in self.requests:
                    raise ValueError(f"request id {s.request_id!r} is already in use")
            self.requests[request_id] = seq
            if seq.traced:
                for s in [seq] + seq.forks:  # each choice has a trace of its own from its arrival on
                    self.step_trace.arrival(s, messages)
            self.scheduler.add(seq)
        return request_id

    choice_ids = staticmethod(choice_ids)

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its blocks. False if unknown or already done."""
        with self._abort_count_lock:  # not the engine's lock: a step holds that one
            self._aborting += 1
            self._no_abort_waits.clear()
        try:
            with self.lock:
                seq = self.requests.get(request_id)
                if seq is None or seq.is_finished:
                    return False
                self.num_aborted += 1
                self.end(seq, "abort")
                return True
        finally:
            with self._abort_count_lock:
                self._aborting -= 1
                if not self._aborting:
                    self._no_abort_waits.set()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._outputs_for_next_step) or self.step_trace.waiting()

    def get_output(self, request_id: str) -> RequestOutput:
        seq = self.requests[request_id]
        return request_output(seq, request_metrics(seq))

    def release(self, request_id: str) -> None:
        """Forget a finished request (its output has been collected)."""
        with self.lock:
            self.requests.release(request_id)

    def cached_prefix_tokens(self, token_ids: list[int]) -> int:
        """How many leading tokens of these ids the prefix cache holds now: the prefill a request
        with them would skip here. A router's hint, read without the lock; it changes nothing."""
        return len(self.block_manager.match_tokens(list(token_ids))) * self.config.block_size

    def live_requests(self) -> list[str]:
        """The ids of the requests not finished yet (waiting or running)."""
        with self.lock:
            return self.requests.live()

    def stop_captures(self, request_id: str, limit_bytes: int) -> bool:
        """A traced request's trace passed its reader's byte cap (limit_bytes): its tensor
        captures (attention, embeddings, MoE routing, logit lens) stop from the next step on,
        and a `trace.truncated` event says so now. False if unknown, finished or untraced.
        Called from a tracer sink inside a step too: the step in progress reads its captures."""
        with self.lock:  # (a traced request has a tracer: without one every level is "off")
            return self.step_trace.stop_captures(self.requests.get(request_id), request_id, limit_bytes,
                                                 self.step_count)

    # --- what the engine is, and what it is doing ------------------------------------
    def describe(self) -> EngineInfo:
        """The model's shape, the KV pool, speculation, the parallel layout, quantization and
        CUDA graphs: fixed once the engine is built, so built once."""
        if self._info is None:
            self._info = describe(self.runner, self.speculator, self.num_speculative_tokens, self.max_model_len)
        return self._info

    def load(self) -> EngineLoad:
        with self.lock:
            return lane_load(self.lane, self.step_count, self.stats, self.num_aborted)

    # --- the loop ----------------------------------------------------------------
    def step(self) -> list[TokenOutput]:
        self._no_abort_waits.wait()  # an abort waiting for the lock takes it first (a Stop acts within a step)
        with self.lock:
            return self._step_in(self.lane)

    def step_lane(self, lane: Lane) -> list[TokenOutput]:  # an engine with more lanes steps each (its lock held)
        return self._step_in(lane)

    def _step_in(self, lane: Lane) -> list[TokenOutput]:
        """One step of this lane's batch (the lock held), then its pool's kv.pool event."""
        if self.tracer is None:  # nothing traced: no capture to cut, no finish event to hold
            return self._step(lane)
        if self.step_trace.idle(lane.scheduler.has_unfinished() or bool(self._outputs_for_next_step)):
            return []  # nothing to run but finished requests' logit lenses: a slice of them instead
        self.step_trace.begin(self.requests)
        try:
            outputs = self._step(lane)
        finally:
            self.step_trace.end()
        self.trace_pool(lane)
        return outputs

    @torch.inference_mode()  # sampling and the trace's tensor work too: less dispatch per op
    def _step(self, lane: Lane) -> list[TokenOutput]:
        """schedule -> propose -> run -> sample -> trace the pass -> commit -> what the step kept."""
        self.step_count += 1
        t_begin = time.perf_counter()  # the step's phases for the timeline: schedule, forward, sample, trace
        outputs, self._outputs_for_next_step = self._outputs_for_next_step, []
        scheduled = self._schedule(lane, outputs)
        if not scheduled:
            return outputs
        t_start = time.perf_counter()
        if self.speculation is not None:
            self.speculation.propose(scheduled)
        step = self._run(lane.runner, scheduled)
        t_forward = time.perf_counter()
        self._sample(step)
        t_sample = time.perf_counter()
        if self.tracer is not None and any(s.seq.traced for s in scheduled):
            self.step_trace.step_pass(step, lane.scheduler, lane.block_manager, t_forward - t_start,
                                      {"start": t_begin, "schedule_seconds": t_start - t_begin,
                                       "sample_seconds": t_sample - t_forward})
        outputs.extend(self._commit(lane, step, t_forward, t_sample))
        if step.rounds:
            self.speculation.count(step, self.stats, self.step_trace)
        if step.capture is not None:
            self.step_trace.captures(step, self.capture)
        return outputs

    def _schedule(self, lane: Lane, outputs: list[TokenOutput]) -> list[ScheduledSeq]:
        """The scheduler's batch. A sequence that cannot grow even alone finishes here (its
        output joins `outputs`); a preempted one loses its proposer state."""
        sched = lane.scheduler.schedule()
        for seq in sched.out_of_memory:
            if seq.traced:
                self.emit(events.kv_exhausted(seq, lane.block_manager.num_blocks))
            outputs.append(self._finish(seq, "length", lane=lane))
        for seq in sched.preempted:
            if self.speculator is not None:
                self.speculator.free(seq)
            if seq.traced:
                self.emit(events.schedule_preempt(seq))
        now = time.perf_counter()
        for seq in sched.admitted:
            seq.first_scheduled_time = seq.first_scheduled_time or now
            self.stats.prefix_queried_tokens += len(seq)
            self.stats.prefix_hit_tokens += seq.num_cached_tokens
        return sched.scheduled

    def _run(self, runner: ModelRunner, scheduled: list[ScheduledSeq]) -> StepPass:
        """The forward pass, with logits at the rows that are sampled (logit_rows)."""
        batch = runner.prepare(scheduled)
        capture = PassCapture.of([s.seq.capture for s in scheduled])  # None unless a `full` trace
        parts, rows = logit_rows(scheduled, batch, capture)
        logits = runner.run(batch, rows, capture)
        self.stats.target_passes += 1
        return StepPass(parts, batch, capture, logits, number=self.step_count)

    def _sample(self, step: StepPass) -> None:
        """The new tokens: the plain draws, all together; then a verification for each speculative round."""
        draws = draw_plain(step, self.model_config.eos_token_ids)
        rounds = [p for p in step.parts if p.rows is not None and p.scheduled.num_draft]
        for p in rounds:
            s, (lo, hi) = p.scheduled, p.rows
            p.verdict = verify(step.logits[lo:hi], s.draft_tokens, s.draft_probs, s.seq.params, s.seq.generator)
            p.tokens = p.verdict.tokens
        step.sampled, step.rounds = draws + rounds, bool(rounds)

    def _commit(self, lane: Lane, step: StepPass, t_forward: float, t_sample: float) -> list[TokenOutput]:
        """After the pass: every sequence's caches advanced, then each new token appended (the
        plain draws' first, then the rounds'), until its sequence stops."""
        for p in step.parts:
            advance_caches(p.scheduled, p.verdict, lane.block_manager, self.speculator)
            if p.prompt_rows is not None:
                keep_prompt_logprobs(p, step.logits)
        outputs = []
        for p in step.sampled:
            seq = p.scheduled.seq
            if not seq.first_token_time:
                seq.prefill_done_time, seq.first_token_time = t_forward, t_sample
                if seq.forks:
                    self._fork(lane, seq)
            lps = None if seq.params.logprobs is None else token_logprobs(
                step.logits[p.rows[0]:p.rows[0] + len(p.tokens)], p.tokens, seq.params.logprobs)
            for j, token in enumerate(p.tokens):
                if seq.traced:
                    self.step_trace.token(step, p, j, token, self.capture)
                out = self.append(lane, seq, token, t_sample, lps[j] if lps is not None else None)
                outputs.append(out)
                if out.finished:
                    break
        return outputs

    def _fork(self, lane: Lane, seq: Sequence) -> list[Sequence]:
        """seq's prompt is computed (its full pages are in the prefix cache): its other choices
        join the queue, take those pages from the cache, and compute only the partial last page."""
        forks, seq.forks = seq.forks, []
        for child in forks:
            self.requests[child.request_id] = child
            lane.scheduler.add(child)
        return forks

    # --- a token appended, a request finished (OutputProcessor) -----------------------
    def append(self, lane: Lane, seq: Sequence, token: int, now: float, logprobs=None,
               between_steps: bool = False) -> TokenOutput:
        """A new token on seq: streamed, or its finish (between_steps: a first token handed over, told next step)."""
        reason = self.output.append(seq, token, now)  # (None: it goes on)
        out = self._finish(seq, reason, token, lane) if reason else self.output.stream(seq, token, self.step_count)
        out.logprobs = logprobs
        if seq.params.prompt_logprobs is not None and seq.num_output_tokens == 1:
            out.prompt_logprobs = [None] + [seq.prompt_logprobs.get(i) for i in range(1, seq.num_prompt_tokens)]
        self.stats.generated_tokens += 1
        if between_steps:
            self._outputs_for_next_step.append(out)
        return out

    def end(self, seq: Sequence, reason: str) -> None:
        """The request ends between steps (an abort): the next step() tells it, as any finish."""
        self._outputs_for_next_step.append(self._finish(seq, reason))

    def end_all(self, reason: str) -> None:
        """Every live request ends, told to no one (an engine around this one failed: its later calls raise)."""
        for rid in self.live_requests():
            self._finish(self.requests[rid], reason)
        self._outputs_for_next_step.clear()

    def _finish(self, seq: Sequence, reason: str, token: int | None = None, lane: Lane | None = None) -> TokenOutput:
        """The request ends: its text and last output, then what it held in its lane freed (its
        choices not started yet end with it), readable until released; its `finish` event."""
        if self.hooks.hold is not None and (kept := self.hooks.hold(seq, reason, token)) is not None:
            return kept  # not ended: kept back, its blocks held (a prefill engine's handover)
        lane = lane or (self.hooks.lane_for(seq) if self.hooks.lane_for else self.lane)  # (several: CoreHooks)
        if seq.forks and token is None:  # ended before its prompt was computed (abort, no room): its choices too
            for child in self._fork(lane, seq):
                self._outputs_for_next_step.append(self._finish(child, reason, lane=lane))  # told with the next step
        self.output.end(seq, reason)
        if self.speculator is not None:
            self.speculator.free(seq)
        out = self.output.last_output(seq, token, self.step_count)
        lane.scheduler.finish(seq, reason)
        self.requests.finished(seq.request_id)
        if seq.traced:
            self.step_trace.finish(events.finish(seq, reason, request_metrics(seq)), self.step_count)
        return out

    # --- tracing (StepTrace) -----------------------------------------------------------
    def emit(self, event: Event, step: int | None = None) -> None:
        """An event from trace.events (plain JSON values already), stamped with the step
        (step: an earlier one's, for what was computed after it: a token's logit lens)."""
        name, request_id, data = self.hooks.stamp(event) if self.hooks.stamp else event
        self.tracer.emit_plain(name, request_id, self.step_count if step is None else step, data)

    def trace_pool(self, lane: Lane) -> None:
        """kv.pool: the lane's block pool after a step (or a change between steps), what changed (KVPoolTracker)."""
        event = lane.pool_trace.after_step(lane.block_manager, lane.scheduler.holding(), self.step_count)
        if event is not None:
            self.emit(event)

    def shutdown(self) -> None:
        """Stop a sharded engine's worker ranks (nothing to do for one device)."""
        self.runner.shutdown()
