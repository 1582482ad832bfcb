"""LLMEngine: the loop that serves requests. add_request -> step() ... -> finished.

Each step: the scheduler picks a batch, the model runner computes it over the paged
KV cache, the sampler draws one token for every sequence whose prompt is fully
computed, and the results are checked against the stop conditions. Every stage is
reported to the tracer for requests whose trace level asks for it.
"""
from __future__ import annotations

import atexit
import gc
import itertools
import secrets
import threading
from collections import deque
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.trace import logit_lens
from engine.batch import CaptureSpec
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.config import DTYPES, ProgressFn
from engine.checkpoint.resolve import load_config, resolve_model_path
from engine.info import EngineInfo, EngineLoad, describe
from engine.model_runner import ModelRunner
from engine.parallel.runner import ParallelRunner
from engine.outputs import RequestOutput, TokenOutput, Usage
from engine.sampler import explain, sample
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledSeq, Scheduler
from engine.speculative import NGRAM, NgramProposer, Proposer, Speculator, Verdict, verify
from engine.sequence import Sequence
from engine.tokenizer import IncrementalDetokenizer, Tokenizer
from engine.trace import TRACE_LEVELS, CaptureConfig, Tracer
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
        draft_path = draft_cfg = None
        if draft is not None and draft != NGRAM:  # check the draft before spending time on the target's weights
            draft_path = resolve_model_path(draft)
            draft_cfg = load_config(draft_path)
            _check_same_vocabulary(self.tokenizer, cfg, Tokenizer(draft_path), draft_cfg, draft_path)
            self.max_model_len = min(self.max_model_len, draft_cfg.max_position_embeddings)
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
        self.speculator: Proposer | None = None  # proposes the tokens each round verifies
        self.num_speculative_tokens = num_speculative_tokens
        if draft is not None and num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be >= 1")
        if draft == NGRAM:
            self.speculator = NgramProposer(prompt_lookup_max, prompt_lookup_min, cfg.vocab_size, self.device)
        elif draft_path is not None:
            # The draft mirrors the target's blocks, plus room for each sequence's proposals.
            extra = self.config.max_num_seqs * (num_speculative_tokens // self.config.block_size + 2)
            draft_config = replace(self.config, num_kv_blocks=self.runner.num_blocks + extra,
                                   kv_cache_memory_fraction=None)
            draft_runner = ModelRunner(draft_path, draft_cfg, draft_config, self.max_model_len,
                                       self.dtype, self.device, progress)
            self.speculator = Speculator(draft_runner, BlockManager(
                draft_runner.num_blocks, self.config.block_size, self.config.enable_prefix_caching),
                self.config.max_num_batched_tokens)
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
        seq.speculative = speculative and self.speculator is not None
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
                                      c.logit_lens_top)
        with self.lock:
            self.requests[request_id] = seq
            if seq.traced:
                self._trace_arrival(seq, messages)
            self.scheduler.add(seq)
        return request_id

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
            if seq is None or seq.is_finished or not seq.traced or self.tracer is None:
                return False
            self._capture_stops.add(request_id)
            self._emit_plain("trace.truncated", request_id, limit_bytes=limit_bytes)
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
            outputs = self._step()
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
            data = self._pool_trace.after_step(self.block_manager, live, self.step_count)
            if data is not None:
                self.tracer.emit_plain("kv.pool", None, self.step_count, data)

    @torch.inference_mode()  # sampling and the trace's tensor work too: less dispatch per op
    def _step(self) -> list[TokenOutput]:
        self.step_count += 1
        t_begin = time.perf_counter()  # the step's phases for the timeline: schedule, forward, sample, trace
        outputs, self._pending = self._pending, []
        sched = self.scheduler.schedule()
        for seq in sched.out_of_memory:
            self._emit_if(seq, "kv.exhausted", blocks=self.block_manager.num_blocks, tokens=len(seq))
            outputs.append(self._finish(seq, "length"))
        for seq in sched.preempted:
            if self.speculator is not None:
                self.speculator.free(seq)
            self._emit_if(seq, "schedule.preempt", tokens=len(seq))
        now = time.perf_counter()
        for seq in sched.admitted:
            seq.first_scheduled_time = seq.first_scheduled_time or now
            self.stats.prefix_queried_tokens += len(seq)
            self.stats.prefix_hit_tokens += seq.num_cached_tokens
        if not sched.scheduled:
            return outputs
        scheduled = sched.scheduled
        t_start = time.perf_counter()
        if self.speculator is not None and any(s.num_draft for s in scheduled):
            self.speculator.propose([s for s in scheduled if s.num_draft])
        batch = self.runner.prepare(scheduled, [s.seq.capture for s in scheduled])
        # Logit rows: the last token of each sampling sequence, or all k+1 verified positions.
        spans: dict[int, tuple[int, int]] = {}
        rows: list[int] = []
        for b, s in enumerate(scheduled):
            if s.samples:
                first = batch.query_starts[b + 1] - 1 - s.num_draft
                spans[b] = (len(rows), len(rows) + s.num_draft + 1)
                rows.extend(range(first, first + s.num_draft + 1))
        lens_at = self._lens_rows(scheduled, batch, spans, rows)
        logits = self.runner.run(batch, rows)
        self.stats.target_passes += 1
        t_forward = time.perf_counter()
        plain = [b for b in spans if not scheduled[b].num_draft]
        seqs = [scheduled[b].seq for b in plain]
        plain_rows = [spans[b][0] for b in plain]
        # every row a plain draw (no speculation this step): the logits as they are, not a copy
        knobs: dict[int, dict] = {}  # a traced draw's filtered logits, which its `sample` event shows
        picks = sample(logits if plain_rows == list(range(len(logits))) else logits[plain_rows],
                       [s.params for s in seqs], [s.generator for s in seqs],
                       knobs if any(s.traced for s in seqs) else None) if plain else []
        new_tokens = {b: [t] for b, t in zip(plain, picks)}
        draw_row = {b: i for i, b in enumerate(plain)}
        verdicts = {}
        for b in spans:
            s = scheduled[b]
            if s.num_draft:
                lo, hi = spans[b]
                verdicts[b] = verify(logits[lo:hi], s.draft_tokens, s.draft_probs, s.seq.params, s.seq.generator)
                new_tokens[b] = verdicts[b].tokens
        t_sample = time.perf_counter()
        if self.tracer is not None and any(s.seq.traced for s in scheduled):
            self._trace_step(scheduled, batch, t_forward - t_start, {
                "start": t_begin, "schedule_seconds": t_start - t_begin, "sample_seconds": t_sample - t_forward})
        for b, s in enumerate(scheduled):
            self._commit(s, verdicts.get(b))
        for b, tokens in new_tokens.items():
            seq = scheduled[b].seq
            if not seq.first_token_time:
                seq.prefill_done_time, seq.first_token_time = t_forward, t_sample
            for j, token in enumerate(tokens):
                if seq.traced:  # the target's distribution at each new token's position
                    info = explain(logits[spans[b][0] + j], seq.params, token, self.capture.top_candidates,
                                   knobs.get(draw_row.get(b)))
                    source = _token_source(verdicts.get(b), j)
                    method = self.speculative_method if source != "target" else None
                    self._emit_plain("sample", seq.request_id, position=len(seq), source=source, method=method,
                                     candidate_texts=[self._piece(t) for t in info["candidates"]],
                                     token_text=self._piece(token), **info)
                    if b in lens_at:
                        self._emit_plain("logit_lens", seq.request_id, position=len(seq), source=source,
                                         **logit_lens.event(logit_lens.rows(batch, lens_at[b] + j), token,
                                                            seq.capture.logit_lens, self._piece))
                out = self._append_token(seq, token, t_sample)
                outputs.append(out)
                self.stats.generated_tokens += 1
                if out.finished:
                    break
        return outputs

    @staticmethod
    def _lens_rows(scheduled: list[ScheduledSeq], batch, spans: dict[int, tuple[int, int]],
                   rows: list[int]) -> dict[int, int]:
        """Mark the sampled rows of sequences with a logit lens on the batch; -> sequence -> its
        first lens row (its j-th new token reads row + j: logit_lens.rows)."""
        at, flat = {}, []
        for b, (lo, hi) in spans.items():
            c = scheduled[b].seq.capture
            if c is not None and c.logit_lens:
                at[b] = len(flat)
                flat.extend(rows[lo:hi])
                batch.lens_out_rows.extend(range(lo, hi))  # where the pass returns their logits
        if flat:
            batch.lens_rows = torch.tensor(flat, dtype=torch.long, device=batch.input_ids.device)
        return at

    def _commit(self, s: ScheduledSeq, verdict: Verdict | None) -> None:
        """After the forward pass: advance what is computed, roll back rejected
        speculative positions in both caches, and offer full blocks to the prefix cache."""
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
        self.speculator.accept(seq, real_len, verdict.accepted, kept)
        seq.spec_proposed += len(s.draft_tokens)
        seq.spec_accepted += verdict.accepted
        self.stats.spec_proposed += len(s.draft_tokens)
        self.stats.spec_accepted += verdict.accepted
        if seq.traced:
            k = len(s.draft_tokens)
            self._emit("spec", seq.request_id, k=k, proposed=s.draft_tokens,
                       proposed_text=[self._piece(t) for t in s.draft_tokens],
                       draft_probs=verdict.draft_probs, target_probs=verdict.target_probs,
                       accepted=verdict.accepted, rejected_position=verdict.accepted if verdict.accepted < k else None,
                       token=verdict.tokens[-1], token_text=self._piece(verdict.tokens[-1]),
                       token_kind="corrected" if verdict.accepted < k else "bonus",
                       acceptance_rate=seq.spec_accepted / seq.spec_proposed, greedy=seq.params.greedy,
                       **self.speculator.describe(seq, self._piece))

    def _append_token(self, seq: Sequence, token: int, now: float) -> TokenOutput:
        seq.token_ids.append(token)
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
                          seq.token_times[-1] - seq.arrival_time, seq.finish_reason is not None, seq.finish_reason)
        if seq.traced:
            prev = seq.token_times[-2] if len(seq.token_times) > 1 else seq.arrival_time
            self._emit_plain("token", seq.request_id, token_id=token, text=delta, index=out.index,
                             t=out.time, latency=seq.token_times[-1] - prev)
        return out

    def _finish(self, seq: Sequence, reason: str, token: int | None = None) -> TokenOutput:
        if not seq.stopped_by_string:
            seq.text += seq.detokenizer.flush()
        seq.finish_reason = reason
        if self.speculator is not None:
            self.speculator.free(seq)
        out = self._token_output(seq, token, len(seq.text)) if token is not None else TokenOutput(
            seq.request_id, -1, "", seq.num_output_tokens, time.perf_counter() - seq.arrival_time, True, reason)
        self.scheduler.finish(seq, reason)
        self._finished.append(seq.request_id)
        while len(self._finished) > self.max_finished:
            self.requests.pop(self._finished.popleft(), None)
        if seq.traced:
            self._emit("finish", seq.request_id, reason=reason, text=seq.text,
                       usage={"prompt_tokens": seq.num_prompt_tokens, "completion_tokens": seq.num_output_tokens,
                              "cached_tokens": seq.num_cached_tokens},
                       **self._metrics(seq))
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

    def _emit(self, type: str, request_id: str | None, **data) -> None:
        self.tracer.emit(type, request_id, self.step_count, **data)

    def _emit_plain(self, type: str, request_id: str | None, **data) -> None:
        """For data made of plain Python values only (no tensors): no conversion walk."""
        self.tracer.emit_plain(type, request_id, self.step_count, data)

    def _emit_if(self, seq: Sequence, type: str, **data) -> None:
        if seq.traced and self.tracer is not None:
            self._emit(type, seq.request_id, **data)

    def _trace_arrival(self, seq: Sequence, messages: list[dict] | None) -> None:
        p = seq.params
        self._emit("request.arrive", seq.request_id, prompt=seq.prompt, messages=messages,
                   params={"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
                           "seed": p.seed, "max_tokens": p.max_tokens, "stop": p.stop, "ignore_eos": p.ignore_eos},
                   trace_level=seq.trace_level)
        ids = seq.prompt_token_ids
        self._emit("tokenize", seq.request_id, tokens=self.tokenizer.pieces(ids), count=len(ids),
                   vocab_size=self.model_config.vocab_size,
                   tokenizer_size=self.tokenizer.vocab_size, chat_template=messages is not None,
                   seconds=seq.tokenized_time - seq.arrival_time)

    def shutdown(self) -> None:
        """Stop a sharded engine's worker ranks (nothing to do for one device)."""
        if hasattr(self.runner, "shutdown"):
            self.runner.shutdown()

    def _trace_step(self, scheduled: list[ScheduledSeq], batch, forward_seconds: float, phases: dict) -> None:
        """phases: the step's start (perf_counter) and its schedule and sample seconds (the forward
        pass is forward_seconds; what follows this event is the trace's own work)."""
        bm = self.block_manager
        if hasattr(self.runner, "trace_events"):  # sharded: what crossed between the ranks (engine/parallel)
            self._emit_plain("schedule.collective", None, placement=self.runner.placement.as_dict(),
                             collectives=self.runner.trace_events(), forward_seconds=forward_seconds,
                             batch=[{"request_id": s.seq.request_id} for s in scheduled])
        self._emit_plain("schedule.step", None, **phases, forward_seconds=forward_seconds,
                         num_tokens=batch.query_starts[-1],
                         batch=[{"request_id": s.seq.request_id, "kind": s.kind, "start": s.start,
                                 "num_tokens": s.num_tokens} for s in scheduled],
                         running=len(self.scheduler.running), waiting=len(self.scheduler.waiting),
                         free_blocks=bm.num_free_blocks, cached_blocks=bm.num_cached_blocks)
        bs = self.config.block_size
        for b, s in enumerate(scheduled):
            seq = s.seq
            if not seq.traced:
                continue
            fills, pos, end = [], s.start, s.start + s.num_tokens
            while pos < end:
                n = min(end, (pos // bs + 1) * bs) - pos
                fills.append({"block": seq.block_table[pos // bs], "offset": pos % bs, "count": n})
                pos += n
            self._emit_plain("kv.fill", seq.request_id, fills=fills, tokens=end, blocks=len(seq.block_table),
                             kind=s.kind)
            if seq.capture is None:
                continue
            # captures are plain lists already (engine/trace/capture.py): emitted without a walk
            rid, step, emit = seq.request_id, self.step_count, self.tracer.emit_plain
            cfg = self.model_config
            if b in batch.captured_embed:
                rows = batch.captured_embed[b]
                emit("embed", rid, step, {"start": s.start, "token_ids": s.token_ids(),
                                          "shape": [s.num_tokens, cfg.hidden_size], "dims": len(rows[0]),
                                          "rows": rows})
            heads = seq.capture.heads if seq.capture.heads is not None else list(range(cfg.num_heads))
            group = cfg.num_heads // cfg.num_kv_heads
            for layer, per_seq in batch.captured_attention.items():
                if b in per_seq:
                    a = per_seq[b]
                    emit("attention", rid, step, {
                        "layer": layer, "kind": s.kind, "heads": list(heads), "kv_heads": [h // group for h in heads],
                        "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads, "q_start": a["q_start"],
                        "k_start": a["k_start"], "window": a["window"], "probs": a["probs"]})
            for layer, per_seq in batch.captured_moe.items():
                if b in per_seq:
                    m = per_seq[b]
                    emit("moe", rid, step, {"layer": layer, "start": s.start, "experts": m["experts"],
                                            "weights": m["weights"], "num_experts": cfg.num_experts,
                                            "top_k": cfg.num_experts_per_tok, "batch_load": batch.expert_load[layer]})


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


def _check_same_vocabulary(tok: Tokenizer, cfg, draft_tok: Tokenizer, draft_cfg, draft_path: Path) -> None:
    if draft_cfg.vocab_size != cfg.vocab_size or draft_tok.hf.get_vocab() != tok.hf.get_vocab():
        raise ValueError(
            f"the draft model in {draft_path} does not share the target's vocabulary "
            f"(draft: {draft_cfg.vocab_size} logits, {draft_tok.vocab_size} tokens; "
            f"target: {cfg.vocab_size} logits, {tok.vocab_size} tokens); speculative decoding needs the same tokenizer")


def _check_messages(messages: list[dict]) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            raise ValueError("each message needs a role (system, user or assistant) and string content")
