"""LLMEngine: the loop that serves requests. add_request -> step() ... -> finished.

Each step, in phases (one method each): the scheduler picks a batch, the proposer (with
speculative decoding) proposes draft tokens, the model runner computes the batch over
the paged KV cache, the sampler draws one token for every sequence whose prompt is fully
computed (or the target verifies the proposals), the pass is traced, and the step is
committed: caches advanced, tokens appended and checked against the stop conditions.
Every stage is reported to the tracer (events built in engine/trace/events.py) for
requests whose trace level asks for it.
"""
from __future__ import annotations

import atexit
import gc
import itertools
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from engine.batch import ForwardBatch
from engine.block_manager import BlockManager
from engine.checkpoint.resolve import load_config, resolve_model_path
from engine.config import DTYPES, EngineConfig, ProgressFn
from engine.info import EngineInfo, EngineLoad, describe
from engine.model_runner import ModelRunner
from engine.parallel.runner import ParallelRunner
from engine.logprobs import token_logprobs
from engine.outputs import RequestOutput, TokenOutput, Usage
from engine.penalties import History
from engine.sampler import explain, sample
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import ScheduledSeq, Sequence
from engine.speculative.proposer import Proposer, SpeculativeConfig
from engine.speculative.verify import Verdict, verify
from engine.tokenizer import IncrementalDetokenizer, Tokenizer
from engine.trace import TRACE_LEVELS, CaptureConfig, Tracer, events, logit_lens
from engine.trace.capture import CaptureSpec, PassCapture
from engine.trace.events import Event
from engine.trace.kv_pool import KVPoolTracker

DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "assets" / "models" / "target"
_ids = itertools.count()
# add_request(context_fit=...): a max_tokens the context cannot hold runs until the context is
# full, is lowered to what fits, or is refused (ContextLengthError, as vLLM's server does)
CONTEXT_FITS = ("run", "lower", "refuse")


class ContextLengthError(ValueError):
    """prompt + max_tokens passes the model's context (add_request with context_fit="refuse")."""

    def __init__(self, prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
        n, want, ctx = prompt_tokens, max_tokens, max_model_len
        super().__init__(f"max_tokens is too large: {want:,}. This model's maximum context length is {ctx:,} "
                         f"tokens and the prompt has {n:,} tokens ({want:,} > {ctx:,} - {n:,}): ask for at "
                         f"most {ctx - n:,}")
        self.prompt_tokens, self.max_tokens, self.max_model_len = n, want, ctx


_heap_frozen = False


def freeze_startup_heap() -> None:
    """Once per process, when the first engine is built: move every object alive then
    (the modules of torch, transformers and the caller's imports, ~300k objects, and that
    engine) into the collector's permanent generation. A traced step allocates ~150 small
    lists and dicts that the trace keeps, so full collections come often, and each walked
    that whole static heap (on CPU, several % of decode time at capture level `full`). vLLM
    freezes its startup heap the same way. The cost: that first engine, if dropped, is
    freed only at exit (its reference cycles are never collected). Unfrozen at exit, so
    shutdown collects as usual."""
    global _heap_frozen
    if not _heap_frozen:
        _heap_frozen = True
        gc.collect()
        gc.freeze()
        atexit.register(gc.unfreeze)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but no CUDA GPU is available")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device!r} (cpu or cuda)")
    return dev


def resolve_dtype(dtype: str | torch.dtype, checkpoint_dtype: str | None, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":  # the checkpoint's own dtype on GPU; float32 on CPU (fast and exact there)
        return DTYPES.get(checkpoint_dtype or "", torch.bfloat16) if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


class LLMEngine:
    """What a server may use: add_request, abort, step, has_unfinished_requests, get_output,
    release, live_requests, stop_captures, describe (engine/info.py), load, shutdown; the
    attributes tokenizer, tracer, model_path, max_model_len, num_speculative_tokens and
    step_count (read only); and the tracer's events. The rest are its parts, free to change."""

    def __init__(self, model: str | Path | None = None, *, device: str = "auto",
                 dtype: str | torch.dtype = "auto", config: EngineConfig | None = None,
                 tracer: Tracer | None = None, trace_level: str = "basic",
                 capture: CaptureConfig | None = None, progress: ProgressFn | None = None,
                 draft: str | Path | None = None, num_speculative_tokens: int = 4,
                 prompt_lookup_max: int = 4, prompt_lookup_min: int = 2, kv_pool_events: str = "traced") -> None:
        """draft: a draft model's path or hub id, or "ngram" for prompt lookup (proposals
        copied from the request's own tokens: the last n tokens, n from prompt_lookup_max
        down to prompt_lookup_min, are looked up earlier in the prompt and output).
        kv_pool_events: when the tracer gets `kv.pool` (engine/trace/kv_pool.py): "traced"
        (while a traced request is live) or "always" (whenever the pool changes: a server
        that draws the pool for untraced requests too)."""
        self.config = config or EngineConfig()
        self.model_path = resolve_model_path(model if model is not None else DEFAULT_MODEL)
        self.model_config = cfg = load_config(self.model_path)
        self.tokenizer = Tokenizer(self.model_path)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, cfg.torch_dtype, self.device)
        self.max_model_len = min(self.config.max_model_len or cfg.max_position_embeddings,
                                 cfg.max_position_embeddings)
        # a draft that cannot serve fails before any weights load
        spec = SpeculativeConfig.resolve(draft, num_speculative_tokens, prompt_lookup_max, prompt_lookup_min,
                                         self.tokenizer, cfg)
        if spec is not None and spec.max_positions is not None:
            self.max_model_len = min(self.max_model_len, spec.max_positions)
        runner_cls = ModelRunner
        if self.config.tensor_parallel_size > 1 or self.config.expert_parallel:  # sharded over ranks
            runner_cls = ParallelRunner
        self.runner = runner_cls(self.model_path, cfg, self.config, self.max_model_len,
                                 self.dtype, self.device, progress)
        self.tracer = tracer
        if trace_level not in TRACE_LEVELS:
            raise ValueError(f"trace_level must be one of {TRACE_LEVELS}")
        self.default_trace_level = trace_level if tracer is not None else "off"
        self.capture = capture or CaptureConfig()
        self.block_manager = BlockManager(self.runner.num_blocks, self.config.block_size,
                                          self.config.enable_prefix_caching,
                                          emit=self._emit if tracer is not None else None)
        self.num_speculative_tokens = num_speculative_tokens
        # proposes the tokens each round verifies (engine/speculative): a draft model beside the target, or n-grams
        self.speculator: Proposer | None = None if spec is None else spec.build(
            self.config, self.runner.num_blocks, self.max_model_len, cfg.vocab_size, self.dtype, self.device, progress)
        self.speculative_method = self.speculator.method if self.speculator is not None else None
        self.scheduler = Scheduler(self.config, self.block_manager,
                                   self._lookahead if self.speculator is not None else None)
        self.requests: dict[str, Sequence] = {}
        # Finished requests stay readable (get_output) until released; past this many
        # the oldest are forgotten, so a caller that never releases cannot grow memory.
        self.max_finished = 1024
        self._finished: deque[str] = deque()
        self._pending: list[TokenOutput] = []  # finishes that happened between steps (aborts)
        self.step_count = 0
        self.num_aborted = 0
        self.stats = EngineStats()
        self.lock = threading.RLock()  # add/abort may come from other threads than step()
        self._info: EngineInfo | None = None  # describe(), built on first use
        if kv_pool_events not in ("traced", "always"):
            raise ValueError("kv_pool_events must be 'traced' or 'always'")
        self._pool_trace = KVPoolTracker(always=kv_pool_events == "always")  # what the last kv.pool said
        self._capture_stops: set[str] = set()  # stop_captures(): applied before the next step
        self._in_step = False  # stop_captures() from a sink inside a step: that step's captures are cut
        self._grammar_compiler = None  # structured outputs' (engine/structured.py), built on first use
        self._traced_now: dict[str, ScheduledSeq] = {}  # the step in progress: its traced sequences' parts
        self._finishes: list[Event] = []  # the step's `finish` events, emitted last
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
        params = params or SamplingParams()
        level = trace_level or self.default_trace_level
        if level not in TRACE_LEVELS:
            raise ValueError(f"trace level must be one of {TRACE_LEVELS}")
        if self.tracer is None:
            level = "off"
        request_id = request_id or f"req-{next(_ids)}"
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if context_fit not in CONTEXT_FITS:
            raise ValueError(f"context_fit must be one of {CONTEXT_FITS}")
        text, ids = self._tokenize(prompt, messages)
        params = self._validate(ids, params, context_fit)
        seq = Sequence(request_id, ids, params, IncrementalDetokenizer.start(self.tokenizer, ids),
                       trace_level=level, prompt=text, arrival_time=arrival)
        seq.tokenized_time = time.perf_counter()
        # penalties and biases read the tokens before each draw: a verified round's positions
        # would need them per position, so such a request decodes one token a step
        seq.speculative = speculative and self.speculator is not None and not params.adjusts_logits
        if num_speculative_tokens is not None:
            if num_speculative_tokens < 0:
                raise ValueError("num_speculative_tokens must be >= 0")
            seq.spec_k = min(num_speculative_tokens, self.num_speculative_tokens)
        if not params.greedy:
            seq.generator = torch.Generator(self.device)
            seq.generator.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
        if level == "full":
            c = self.capture
            layers = c.attention_layers if c.attention_layers is not None else list(range(self.model_config.num_layers))
            seq.capture = CaptureSpec(layers, c.heads, c.max_keys, self.model_config.is_moe, c.embed_dims,
                                      c.logit_lens_top, c.compact)
        if params.structured is not None:
            seq.grammar = self._grammars().matcher(params.structured)  # ValueError: it does not compile
        seq.forks = [self._choice(seq, i) for i in range(1, params.n)]
        with self.lock:
            for s in [seq] + seq.forks:
                if s.request_id in self.requests:
                    raise ValueError(f"request id {s.request_id!r} is already in use")
            self.requests[request_id] = seq
            if seq.traced:
                self._trace_arrival(seq, messages)
                for s in seq.forks:  # each choice has a trace of its own from its arrival on
                    self._trace_arrival(s, messages)
            self.scheduler.add(seq)
        return request_id

    @staticmethod
    def choice_ids(request_id: str, n: int) -> list[str]:
        """The request ids of a request's n choices: its own first, then "<id>.1" ... "<id>.<n-1>"."""
        return [request_id] + [f"{request_id}.{i}" for i in range(1, n)]

    def _choice(self, seq: Sequence, i: int) -> Sequence:
        """Choice i of seq's n: the same prompt and knobs with its own random draws (seed + i,
        as vLLM seeds the n choices), no prompt logprobs (choice 0 has them). Queued by _fork."""
        params = replace(seq.params, n=1, prompt_logprobs=None,
                         seed=None if seq.params.seed is None else (seq.params.seed + i) % 2 ** 64)
        child = Sequence(self.choice_ids(seq.request_id, i + 1)[-1], list(seq.prompt_token_ids), params,
                         IncrementalDetokenizer.start(self.tokenizer, seq.prompt_token_ids),
                         trace_level=seq.trace_level, prompt=seq.prompt, arrival_time=seq.arrival_time)
        child.tokenized_time, child.speculative, child.spec_k = seq.tokenized_time, seq.speculative, seq.spec_k
        child.capture = replace(seq.capture) if seq.capture is not None else None
        child.grammar = seq.grammar.fork() if seq.grammar is not None else None
        if not params.greedy:
            child.generator = torch.Generator(self.device)
            child.generator.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
        return child

    def _grammars(self):
        """The structured-output compiler (engine/structured.py), built on first use."""
        if self._grammar_compiler is None:
            from engine.structured import Grammars
            self._grammar_compiler = Grammars(self.tokenizer.hf, self.model_config.vocab_size,
                                              self.model_config.eos_token_ids)
        return self._grammar_compiler

    def _fork(self, seq: Sequence) -> None:
        """seq's prompt is computed (its full pages are in the prefix cache): its other choices
        join the queue, take those pages from the cache, and compute only the partial last page."""
        for child in seq.forks:
            self.requests[child.request_id] = child
            self.scheduler.add(child)
        seq.forks = []

    def _tokenize(self, prompt, messages) -> tuple[str | None, list[int]]:
        if messages is not None:
            _check_messages(messages)
            return self.tokenizer.apply_chat_template(messages), self.tokenizer.encode_chat(messages)
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise ValueError("a prompt is a string or a list of token ids (or pass messages=...)")

    def _validate(self, ids: list[int], params: SamplingParams, context_fit: str) -> SamplingParams:
        """The prompt's checks, and max_tokens against the context: -> the params to run with."""
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = self.model_config.vocab_size
        if any(t < 0 or t >= vocab for t in ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens but this model's context is {self.max_model_len} "
                             "tokens, and at least one must be generated")
        if any(not 0 <= t < vocab for t in params.logit_bias):
            raise ValueError(f"logit_bias token ids must be in [0, {vocab})")
        room = self.max_model_len - len(ids)
        if params.max_tokens > room and context_fit == "refuse":
            raise ContextLengthError(len(ids), params.max_tokens, self.max_model_len)
        if params.max_tokens > room and context_fit == "lower":
            params = replace(params, max_tokens=room)
        if self.block_manager.blocks_for(len(ids) + 1) > self.block_manager.num_blocks:
            raise ValueError(f"the prompt has {len(ids)} tokens but the KV cache holds only "
                             f"{self.block_manager.num_blocks * self.config.block_size}")
        return params

    def _lookahead(self, seq: Sequence) -> int:
        """Draft tokens to verify for this decoding sequence: k, less near its end, or
        what the proposer has (n-gram lookup: what follows the match, 0 without one)."""
        if not seq.speculative:
            return 0
        room = min(seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - len(seq))
        k = self.num_speculative_tokens if seq.spec_k is None else seq.spec_k
        k = max(0, min(k, room - 1, self.config.max_num_batched_tokens - 1))
        return self.speculator.lookahead(seq, k) if k else 0

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its blocks. False if unknown or already done."""
        with self.lock:
            seq = self.requests.get(request_id)
            if seq is None or seq.is_finished:
                return False
            self.num_aborted += 1
            # The next step() reports it like any other finish, so a stream sees its end.
            self._pending.append(self._finish(seq, "abort"))
            return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._pending)

    def get_output(self, request_id: str) -> RequestOutput:
        seq = self.requests[request_id]
        return RequestOutput(
            request_id=seq.request_id, prompt=seq.prompt, prompt_token_ids=list(seq.prompt_token_ids),
            token_ids=list(seq.output_token_ids), text=seq.text, finish_reason=seq.finish_reason,
            usage=Usage(seq.num_prompt_tokens, seq.num_output_tokens, seq.num_cached_tokens),
            metrics=self._metrics(seq))

    def release(self, request_id: str) -> None:
        """Forget a finished request (its output has been collected)."""
        with self.lock:
            seq = self.requests.get(request_id)
            if seq is not None and seq.is_finished:
                del self.requests[request_id]

    def cached_prefix_tokens(self, token_ids: list[int]) -> int:
        """How many leading tokens of these ids the prefix cache holds now (whole blocks, at
        least one token left to compute): the prefill a request with this prompt would skip
        here. A router's question (app/serving/router.py); it changes nothing, not even LRU order.
        Read without the engine's lock, so a router never waits for a step (a long prefill) of
        every replica: a hint that may be one step old (admission matches the prefix again)."""
        return len(self.block_manager.match_tokens(list(token_ids))) * self.config.block_size

    def live_requests(self) -> list[str]:
        """The ids of the requests not finished yet (waiting or running)."""
        with self.lock:
            return [rid for rid, seq in self.requests.items() if not seq.is_finished]

    def stop_captures(self, request_id: str, limit_bytes: int) -> bool:
        """A traced request's trace passed its reader's byte cap (limit_bytes): its tensor
        captures (attention, embeddings, MoE routing, logit lens) stop from the next step on,
        and a `trace.truncated` event says so now. False if unknown, finished or untraced.
        Called from a tracer sink inside a step too: the step in progress reads its captures."""
        with self.lock:
            seq = self.requests.get(request_id)
            # (a request that finished in the step in progress still has that step's captures to cut)
            if seq is None or not seq.traced or self.tracer is None or \
                    (seq.is_finished and not (self._in_step and request_id in self._traced_now)):
                return False
            self._capture_stops.add(request_id)
            s = self._traced_now.get(request_id) if self._in_step else None
            if s is None:  # between steps: the next pass is the first without captures
                position, step = len(seq) - 1, self.step_count + 1
            else:  # the pass in progress (its captures are cut from here on): where its rows begin
                position, step = s.start, self.step_count
            made = max(0, s.start + s.num_tokens - s.num_draft - seq.num_prompt_tokens) if s else seq.num_output_tokens
            self._emit(events.trace_truncated(request_id, limit_bytes, step, position, made))
            return True

    # --- what the engine is, and what it is doing (engine/info.py) -------------------
    def describe(self) -> EngineInfo:
        """The model's shape, the KV pool, speculation, the parallel layout, quantization and
        CUDA graphs: fixed once the engine is built, so built once."""
        if self._info is None:
            self._info = describe(self.runner, self.speculator, self.num_speculative_tokens, self.max_model_len)
        return self._info

    def load(self) -> EngineLoad:
        bm, st = self.block_manager, self.stats
        with self.lock:
            cached = bm.num_free_cached_blocks
            return EngineLoad(len(self.scheduler.running), len(self.scheduler.waiting),
                              bm.num_blocks - bm.num_free_blocks, cached, bm.num_free_blocks - cached,
                              self.step_count, st.target_passes, st.generated_tokens, self.num_aborted,
                              st.prefix_queried_tokens, st.prefix_hit_tokens, st.spec_proposed, st.spec_accepted)

    # --- the loop ----------------------------------------------------------------
    def step(self) -> list[TokenOutput]:
        with self.lock:
            self._apply_capture_stops()
            self._in_step = True
            try:
                outputs = self._step()
            finally:
                self._in_step = False
                self._traced_now = {}
                self._emit_finishes()
            self._trace_pool()
            return outputs

    def _apply_capture_stops(self) -> None:
        for rid in self._capture_stops:
            seq = self.requests.get(rid)
            if seq is not None:
                seq.capture = None
        self._capture_stops.clear()

    def _trace_pool(self) -> None:
        """kv.pool: the block pool after the step, what changed (engine/trace/kv_pool.py)."""
        if self.tracer is not None:
            live = self.scheduler.running + list(self.scheduler.waiting)
            event = self._pool_trace.after_step(self.block_manager, live, self.step_count)
            if event is not None:
                self._emit(event)

    @torch.inference_mode()  # sampling and the trace's tensor work too: less dispatch per op
    def _step(self) -> list[TokenOutput]:
        self.step_count += 1
        t_begin = time.perf_counter()  # the step's phases for the timeline: schedule, forward, sample, trace
        outputs, self._pending = self._pending, []
        scheduled = self._schedule(outputs)
        if not scheduled:
            return outputs
        t_start = time.perf_counter()
        self._propose(scheduled)
        step = self._run(scheduled)
        t_forward = time.perf_counter()
        self._sample(step)
        t_sample = time.perf_counter()
        if self.tracer is not None and any(s.seq.traced for s in scheduled):
            self._traced_now = {s.seq.request_id: s for s in scheduled if s.seq.traced}
            self._trace(step, t_forward - t_start, {"start": t_begin, "schedule_seconds": t_start - t_begin,
                                                    "sample_seconds": t_sample - t_forward})
        outputs.extend(self._commit(step, t_forward, t_sample))
        self._kept(step)
        return outputs

    def _emit_finishes(self) -> None:
        finishes, self._finishes = self._finishes, []
        for event in finishes:
            self._emit(event)

    def _schedule(self, outputs: list[TokenOutput]) -> list[ScheduledSeq]:
        """The scheduler's batch. A sequence that cannot grow even alone finishes here (its
        output joins `outputs`); a preempted one loses its proposer state."""
        sched = self.scheduler.schedule()
        for seq in sched.out_of_memory:
            if seq.traced:
                self._emit(events.kv_exhausted(seq, self.block_manager.num_blocks))
            outputs.append(self._finish(seq, "length"))
        for seq in sched.preempted:
            if self.speculator is not None:
                self.speculator.free(seq)
            if seq.traced:
                self._emit(events.schedule_preempt(seq))
        now = time.perf_counter()
        for seq in sched.admitted:
            seq.first_scheduled_time = seq.first_scheduled_time or now
            self.stats.prefix_queried_tokens += len(seq)
            self.stats.prefix_hit_tokens += seq.num_cached_tokens
        return sched.scheduled

    def _propose(self, scheduled: list[ScheduledSeq]) -> None:
        """Draft tokens for the sequences that verify a round this step."""
        if self.speculator is not None and any(s.num_draft for s in scheduled):
            self.speculator.propose([s for s in scheduled if s.num_draft])

    def _run(self, scheduled: list[ScheduledSeq]) -> StepPass:
        """The forward pass, with logits at the rows that are sampled: the last token of each
        sequence that samples, or all k+1 positions a round verifies."""
        batch = self.runner.prepare(scheduled)
        capture = PassCapture.of([s.seq.capture for s in scheduled])  # None unless a `full` trace
        seqs, rows = [], []
        for b, s in enumerate(scheduled):
            part = SeqStep(s)
            if s.samples:
                first = batch.query_starts[b + 1] - 1 - s.num_draft
                part.rows = (len(rows), len(rows) + s.num_draft + 1)
                rows.extend(range(first, first + s.num_draft + 1))
            seqs.append(part)
        _mark_prompt_rows(seqs, rows, batch.query_starts)
        if capture is not None:
            _mark_lens(seqs, rows, capture, batch.input_ids.device)
        logits = self.runner.run(batch, rows, capture)
        self.stats.target_passes += 1
        return StepPass(seqs, batch, capture, logits)

    def _sample(self, step: StepPass) -> None:
        """The new tokens: one plain draw for every sampling sequence without proposals, all
        drawn together; a verification for each speculative round."""
        logits = step.logits
        draws = [p for p in step.seqs if p.rows is not None and not p.s.num_draft]
        rounds = [p for p in step.seqs if p.rows is not None and p.s.num_draft]
        if draws:
            rows = [p.rows[0] for p in draws]
            seqs = [p.s.seq for p in draws]
            # every row a plain draw (no speculation this step): the logits as they are, not a copy
            picks = sample(logits if rows == list(range(len(logits))) else logits[rows],
                           [s.params for s in seqs], [s.generator for s in seqs],
                           step.knobs if any(s.traced for s in seqs) else None,
                           [self._history(s) if s.params.adjusts_logits else None for s in seqs])
            for i, (p, token) in enumerate(zip(draws, picks)):
                p.draw, p.tokens = i, [token]
        for p in rounds:
            s = p.s
            lo, hi = p.rows
            p.verdict = verify(logits[lo:hi], s.draft_tokens, s.draft_probs, s.seq.params, s.seq.generator)
            p.tokens = p.verdict.tokens
        step.sampled = draws + rounds

    def _history(self, seq: Sequence) -> History:
        """What penalties, biases and min_tokens read of seq (engine/penalties.py)."""
        p = seq.params
        stops = list(p.stop_token_ids) + ([] if p.ignore_eos else list(self.model_config.eos_token_ids))
        return History(seq.prompt_token_ids, seq.output_token_ids, stops, seq.grammar)

    def _trace(self, step: StepPass, forward_seconds: float, phases: dict) -> None:
        """The pass, for the trace: the step's schedule (and a sharded step's collectives), where
        each traced sequence's K/V went, and a `full` trace's captures. Before the commit: it
        rolls rejected proposals' blocks back, and kv.fill shows them written."""
        scheduled = [p.s for p in step.seqs]
        bm, runner = self.block_manager, self.runner
        if runner.placement is not None:  # sharded: what crossed between the ranks (engine/parallel)
            self._emit(events.schedule_collective(scheduled, runner.placement.as_dict(), runner.trace_events(),
                                                  forward_seconds))
        self._emit(events.schedule_step(scheduled, phases, forward_seconds, step.batch.query_starts[-1],
                                        len(self.scheduler.running), len(self.scheduler.waiting),
                                        bm.num_free_blocks, bm.num_cached_blocks))
        for b, s in enumerate(scheduled):
            if s.seq.traced:
                self._emit(events.kv_fill(s, self.config.block_size))
        for p in step.seqs:  # what the proposer says of a round, read before the commit moves the sequence on
            if p.verdict is not None and p.s.seq.traced:
                p.spec_details = self.speculator.describe(p.s.seq, self._piece)

    def _kept(self, step: StepPass) -> None:
        """After the commit, what the step kept: each speculative round counted (and traced) by
        the tokens its sequence kept, and a `full` trace's captures of the rows that read a
        token the sequence kept. None of a rejected proposal (that row read a token the position
        does not hold), none past an end of sequence (a round that ended early read positions
        the sequence never has); the newest token is never read: no pass has it as an input."""
        for b, p in enumerate(step.seqs):
            s = p.s
            seq = s.seq
            if p.verdict is not None:
                self._count_round(p)
            if seq.traced and step.capture is not None and s.seq.capture is not None:
                self._trace_captures(step.capture, b, s, min(s.start + s.num_tokens, len(seq) - 1))

    def _count_round(self, p: SeqStep) -> None:
        """A round's proposals and accepted drafts, counted up to the last token kept."""
        s, v = p.s, p.verdict
        seq = s.seq
        kept = min(len(seq) - s.start - 1, len(v.tokens))  # the round began at position s.start + 1
        proposed = min(kept, len(s.draft_tokens)) if seq.is_finished else len(s.draft_tokens)
        accepted = min(v.accepted, kept)
        seq.spec_proposed += proposed
        seq.spec_accepted += accepted
        self.stats.spec_proposed += proposed
        self.stats.spec_accepted += accepted
        if seq.traced:
            self._emit(events.spec(s, v, self._piece, p.spec_details or {}, kept, proposed))

    def _trace_captures(self, capture: PassCapture, b: int, s: ScheduledSeq, end: int) -> None:
        """Sequence b's embedding rows, attention and MoE routing, of positions before `end`."""
        cfg, spec = self.model_config, s.seq.capture
        out = []
        if b in capture.embed:
            out.append(events.embed(s, capture.embed[b], cfg.hidden_size, end, spec.compact))
        heads = spec.heads if spec.heads is not None else list(range(cfg.num_heads))
        if b in capture.attention:
            out.append(events.attention(s, capture.attention[b], heads, cfg, end, spec.compact))
        for layer, per_seq in capture.moe.items():
            if b in per_seq:
                out.append(events.moe(s, layer, per_seq[b], capture.expert_load[layer], cfg, end))
        for event in out:
            if event is not None:
                self._emit(event)

    def _commit(self, step: StepPass, t_forward: float, t_sample: float) -> list[TokenOutput]:
        """After the pass: every sequence's caches advanced, then each new token appended (the
        plain draws' first, then the rounds'), until its sequence stops."""
        for p in step.seqs:
            self._advance(p.s, p.verdict)
            if p.prompt_rows is not None:
                _keep_prompt_logprobs(p, step.logits)
        outputs = []
        for p in step.sampled:
            seq = p.s.seq
            if not seq.first_token_time:
                seq.prefill_done_time, seq.first_token_time = t_forward, t_sample
                if seq.forks:
                    self._fork(seq)
            lps = None if seq.params.logprobs is None else token_logprobs(
                step.logits[p.rows[0]:p.rows[0] + len(p.tokens)], p.tokens, seq.params.logprobs)
            for j, token in enumerate(p.tokens):
                if seq.traced:
                    self._trace_token(step, p, j, token)
                out = self._append_token(seq, token, t_sample)
                out.logprobs = lps[j] if lps is not None else None
                if seq.params.prompt_logprobs is not None and seq.num_output_tokens == 1:
                    out.prompt_logprobs = [None] + [seq.prompt_logprobs.get(i) for i in range(1, seq.num_prompt_tokens)]
                outputs.append(out)
                self.stats.generated_tokens += 1
                if out.finished:
                    break
        return outputs

    def _trace_token(self, step: StepPass, p: SeqStep, j: int, token: int) -> None:
        """The target's distribution at p's j-th new token's position, and its logit lens."""
        seq = p.s.seq
        info = explain(step.logits[p.rows[0] + j], seq.params, token, self.capture.top_candidates,
                       step.knobs.get(p.draw))
        source = _token_source(p.verdict, j)
        method = self.speculative_method if source != "target" else None
        self._emit(events.sample(seq, source, method, token, info, self._piece))
        if p.lens_row is not None:
            self._emit(events.logit_lens(seq, source, logit_lens.rows(step.capture, p.lens_row + j), token,
                                         seq.capture.logit_lens, self._piece))

    def _advance(self, s: ScheduledSeq, verdict: Verdict | None) -> None:
        """Advance what is computed, roll back rejected speculative positions in both
        caches, and offer full blocks to the prefix cache."""
        seq = s.seq
        old = seq.num_computed_tokens
        if verdict is None:
            seq.num_computed_tokens += s.num_tokens
            self.block_manager.truncate(seq, seq.num_computed_tokens)  # proposals dropped: their blocks too
            self.block_manager.commit_full_blocks(seq, old)
            return
        real_len = len(seq)
        seq.num_computed_tokens = s.start + 1 + verdict.accepted
        self.block_manager.truncate(seq, seq.num_computed_tokens)
        kept = seq.token_ids + s.draft_tokens[:verdict.accepted]
        self.block_manager.commit_full_blocks(seq, old, kept)
        self.speculator.accept(seq, real_len, verdict.accepted, kept)  # counted and traced by _kept

    def _append_token(self, seq: Sequence, token: int, now: float) -> TokenOutput:
        seq.token_ids.append(token)
        if seq.grammar is not None:
            seq.grammar.accept(token)
        seq.token_times.append(now)
        seq.text += seq.detokenizer.push(token)
        reason = self._stop_reason(seq, token)
        if reason is not None:
            return self._finish(seq, reason, token)
        visible = len(seq.text) - self._holdback(seq)
        return self._token_output(seq, token, visible)

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if (not p.ignore_eos and token in self.model_config.eos_token_ids) or token in p.stop_token_ids:
            return "stop"
        for stop in p.stop:
            idx = seq.text.find(stop)
            if idx != -1:
                seq.text = seq.text[: idx + (len(stop) if p.include_stop_str_in_output else 0)]
                seq.stopped_by_string = True
                return "stop"
        if seq.grammar is not None and seq.grammar.finished:  # the grammar took its end (ignore_eos included)
            return "stop"
        if seq.num_output_tokens >= p.max_tokens or len(seq) >= self.max_model_len:
            return "length"
        return None

    @staticmethod
    def _holdback(seq: Sequence) -> int:
        """Characters not streamed yet because they might begin a stop string."""
        return max((len(s) - 1 for s in seq.params.stop), default=0)

    def _token_output(self, seq: Sequence, token: int, visible: int) -> TokenOutput:
        delta = seq.text[seq.streamed_chars:max(visible, seq.streamed_chars)]
        seq.streamed_chars += len(delta)
        out = TokenOutput(seq.request_id, token, delta, seq.num_output_tokens - 1,
                          seq.token_times[-1] - seq.arrival_time, seq.finish_reason is not None, seq.finish_reason,
                          step=self.step_count)
        if seq.traced:
            self._emit(events.token(seq, out))
        return out

    def _finish(self, seq: Sequence, reason: str, token: int | None = None) -> TokenOutput:
        if seq.forks and token is None:  # ended before its prompt was computed (abort, no room): its choices too
            forks, seq.forks = seq.forks, []
            for child in forks:
                self.requests[child.request_id] = child
                self.scheduler.add(child)
                self._pending.append(self._finish(child, reason))  # told with the next step
        if not seq.stopped_by_string:
            seq.text += seq.detokenizer.flush()
        seq.finish_reason = reason
        if self.speculator is not None:
            self.speculator.free(seq)
        out = self._token_output(seq, token, len(seq.text)) if token is not None else TokenOutput(
            seq.request_id, -1, "", seq.num_output_tokens, time.perf_counter() - seq.arrival_time, True, reason,
            step=self.step_count)
        self.scheduler.finish(seq, reason)
        self._finished.append(seq.request_id)
        while len(self._finished) > self.max_finished:
            self.requests.pop(self._finished.popleft(), None)
        if seq.traced:  # in a step, after what the step kept (_kept): a trace's captures come before its end
            event = events.finish(seq, reason, self._metrics(seq))
            if self._in_step:
                self._finishes.append(event)
            else:
                self._emit(event)
        return out

    def _metrics(self, seq: Sequence) -> dict:
        if not seq.first_token_time:
            return {"preemptions": seq.num_preemptions}
        times = [seq.first_token_time] + seq.token_times[1:]
        return {
            "ttft": seq.first_token_time - seq.arrival_time,
            "ttft_split": {"tokenize": seq.tokenized_time - seq.arrival_time,
                           "queue": seq.first_scheduled_time - seq.tokenized_time,
                           "prefill": seq.prefill_done_time - seq.first_scheduled_time,
                           "first_sample": seq.first_token_time - seq.prefill_done_time},
            "token_latencies": [b - a for a, b in zip(times, times[1:])],
            "preemptions": seq.num_preemptions,
        }

    # --- tracing -------------------------------------------------------------------
    def _piece(self, token_id: int) -> str:
        """A token's text for the trace, special tokens included (a replay has no tokenizer)."""
        return self.tokenizer.token_text(token_id)

    def _emit(self, event: Event) -> None:
        """An event from engine/trace/events.py (plain JSON values already), stamped with the step."""
        name, request_id, data = event
        self.tracer.emit_plain(name, request_id, self.step_count, data)

    def _trace_arrival(self, seq: Sequence, messages: list[dict] | None) -> None:
        self._emit(events.request_arrive(seq, messages))
        self._emit(events.tokenize(seq, self.tokenizer.pieces(seq.prompt_token_ids), self.model_config.vocab_size,
                                   self.tokenizer.vocab_size, messages is not None))

    def shutdown(self) -> None:
        """Stop a sharded engine's worker ranks (nothing to do for one device)."""
        self.runner.shutdown()


@dataclass(slots=True)
class SeqStep:
    """One scheduled sequence's part of a step: where its logits are among those the pass
    returns, how its new tokens came (a plain draw or a verified round) and what they are."""
    s: ScheduledSeq
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
    seqs: list[SeqStep]  # one per scheduled sequence, in batch order
    batch: ForwardBatch
    capture: PassCapture | None
    logits: torch.Tensor
    sampled: list[SeqStep] = field(default_factory=list)  # those with new tokens, in the order appended
    knobs: dict[int, dict] = field(default_factory=dict)  # a traced draw's filtered logits, shown by `sample`


def _mark_prompt_rows(seqs: list[SeqStep], rows: list[int], query_starts: list[int]) -> None:
    """The flat rows of the prompt positions whose logits score the next prompt token, for
    sequences that ask for prompt logprobs, appended to `rows` (after every sampled row)."""
    for b, p in enumerate(seqs):
        s = p.s
        if s.seq.params.prompt_logprobs is None:
            continue
        end = min(s.start + s.num_tokens, s.seq.num_prompt_tokens - 1)  # position P-1 predicts the first output
        if end > s.start:
            p.prompt_rows = (len(rows), s.start, end - s.start)
            rows.extend(range(query_starts[b], query_starts[b] + end - s.start))


def _keep_prompt_logprobs(p: SeqStep, logits: torch.Tensor) -> None:
    """Each computed prompt position's log-probabilities of the prompt's next token, kept on
    the sequence by position (a preempted sequence recomputes them: the same values again)."""
    lo, pos, n = p.prompt_rows
    seq = p.s.seq
    targets = seq.prompt_token_ids[pos + 1:pos + 1 + n]
    for j, lp in enumerate(token_logprobs(logits[lo:lo + n], targets, seq.params.prompt_logprobs)):
        seq.prompt_logprobs[pos + 1 + j] = lp


def _mark_lens(seqs: list[SeqStep], rows: list[int], capture: PassCapture, device: torch.device) -> None:
    """Mark the sampled rows of sequences with a logit lens: the flat rows the model keeps
    (capture.lens_rows), where they are among the returned rows (lens_out_rows), and each
    sequence's first lens row (logit_lens.rows reads them)."""
    flat = []
    for p in seqs:
        c = p.s.seq.capture
        if p.rows is not None and c is not None and c.logit_lens:
            lo, hi = p.rows
            p.lens_row = len(flat)
            flat.extend(rows[lo:hi])
            capture.lens_out_rows.extend(range(lo, hi))  # where the pass returns their logits
    if flat:
        capture.lens_rows = torch.tensor(flat, dtype=torch.long, device=device)


@dataclass
class EngineStats:
    target_passes: int = 0  # forward passes of the target model
    generated_tokens: int = 0
    spec_proposed: int = 0
    spec_accepted: int = 0
    prefix_queried_tokens: int = 0  # tokens of admitted sequences looked up in the prefix cache
    prefix_hit_tokens: int = 0  # of those, found there


def _token_source(verdict: Verdict | None, j: int) -> str:
    """Where a step's j-th new token came from: a plain draw from the target, an accepted
    draft proposal, the draw from max(0, p - q) after a rejection, or the bonus draw."""
    if verdict is None:
        return "target"
    if j < verdict.accepted:
        return "draft"
    return "bonus" if verdict.accepted == len(verdict.target_probs) else "corrected"


def _check_messages(messages: list[dict]) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            raise ValueError("each message needs a role (system, user or assistant) and string content")
