"""The engine service: one background thread runs LLMEngine.step(); a tracer sink copies
every event into the trace store and into the queues of whoever watches that request.

Web handlers never call step() and never wait on the engine's lock in the event loop:
they submit, then read their queue from a worker thread. The KV block pool is read
(under the engine's lock, on the engine thread) after every step, so each page can
draw the other requests' blocks too.
"""
from __future__ import annotations

import itertools
import logging
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field, replace
from functools import cached_property

from jinja2 import TemplateError

from app.serving.limits import ClientSlots, RequestRefused, ServeLimits
from app.serving.requests import Submission
from app.serving.trace_store import TraceStore
from engine import LLMEngine, TraceEvent

log = logging.getLogger("tokentrace")
_ids = itertools.count(1)


@dataclass
class Subscription:
    """One watcher's queue: trace events (dicts) of its request(s), plus app items of
    type "output" (a streamed token, for every trace level) and "error"."""
    request_id: str | None  # None: every request (the /ws firehose)
    queue: "queue.SimpleQueue[dict]" = field(default_factory=queue.SimpleQueue)
    max_items: int | None = None  # bounded: a slow reader loses items (counted), never stalls the engine
    dropped: int = 0

    def offer(self, item: dict) -> None:
        if self.max_items is not None and self.queue.qsize() >= self.max_items:
            self.dropped += 1
        else:
            self.queue.put(item)

    def drain(self, timeout: float) -> list[dict]:
        """Everything queued now, waiting up to `timeout` for the first item."""
        items = []
        try:
            items.append(self.queue.get(timeout=timeout))
            while True:
                items.append(self.queue.get_nowait())
        except queue.Empty:
            pass
        return items


@dataclass(frozen=True)
class KVSnapshot:
    """The block pool after one engine step (all requests, not only traced ones)."""
    step: int
    num_blocks: int
    block_size: int
    ref: tuple[int, ...]
    cached: tuple[bool, ...]
    owners: dict[int, list[str]]
    fill: dict[int, int]

    @cached_property
    def as_dict(self) -> dict:  # built once per step, however many pages read it
        return {"step": self.step, "num_blocks": self.num_blocks, "block_size": self.block_size,
                "ref": list(self.ref), "cached": list(self.cached), "owners": self.owners, "fill": self.fill}


class EngineService:
    def __init__(self, engine: LLMEngine, store: TraceStore | None = None, model_name: str | None = None,
                 limits: ServeLimits | None = None, slots: ClientSlots | None = None,
                 draft_name: str | None = None) -> None:
        """slots: the per-client count of requests in flight, shared by every engine of one
        server (a client's cap counts its requests to all models); draft_name: what drafts for
        this engine, as the page names it ("ngram", a draft model's name)."""
        if engine.tracer is None:
            raise ValueError("the engine needs a Tracer for the service to watch it")
        self.engine = engine
        self.store = store or TraceStore()
        self.model_name = model_name or engine.model_path.name
        self.draft_name = draft_name
        self._subs: dict[str, list[Subscription]] = {}
        self._firehose: list[Subscription] = []
        self._subs_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.snapshot: KVSnapshot | None = None
        self.output_listeners: list = []  # called on the engine thread with every output item (metrics)
        self.error: str | None = None
        self.limits = limits or ServeLimits()
        self.slots = slots or ClientSlots(self.limits.max_concurrent_per_client)
        self.output_listeners.append(self._release_slot)
        self._uncapture: set[str] = set()  # requests whose trace passed its cap: stop their tensor captures
        engine.tracer.add_sink(self._on_event)
        with engine.lock:
            self._take_snapshot()

    # --- model facts the page shows (all read from the engine) -------------------
    def model_info(self) -> dict:
        e, cfg = self.engine, self.engine.model_config
        return {"name": self.model_name, "num_layers": cfg.num_layers, "num_heads": cfg.num_heads,
                "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "hidden_size": cfg.hidden_size,
                "vocab_size": cfg.vocab_size, "num_experts": cfg.num_experts, "top_k": cfg.num_experts_per_tok,
                "is_moe": cfg.is_moe, "moe_layers": [i for i, m in enumerate(cfg.moe_layers) if m],
                "sliding_windows": list(cfg.sliding_windows), "dtype": str(e.dtype).replace("torch.", ""),
                "query_pre_attn_scalar": cfg.query_pre_attn_scalar, "mlp_activation": cfg.hidden_act,
                "dtype_bytes": e.runner.kv_cache.element_size(), "num_blocks": e.block_manager.num_blocks,
                "block_size": e.config.block_size, "kv_cache_bytes": e.runner.kv_cache_bytes,
                "max_model_len": e.max_model_len, "has_draft": e.speculator is not None,
                "num_speculative_tokens": e.num_speculative_tokens, "device": str(e.device),
                "architecture": cfg.architecture, "chat_template": e.tokenizer.has_chat_template,
                "draft": self.draft_kind(), "weights_bytes": self.weights_bytes,
                "tensor_parallel_size": e.config.tensor_parallel_size, "expert_parallel": e.config.expert_parallel,
                "split_sizes": split_sizes(cfg),
                "quantization": q.summary() if (q := getattr(e.runner.model, "quantization", None)) else None}

    def draft_kind(self) -> str | None:
        """None (no speculation), "ngram" (prompt lookup) or the draft model's name."""
        spec = self.engine.speculator
        if spec is None:
            return None
        if getattr(self.engine, "speculative_method", None) == "ngram" or "gram" in type(spec).__name__.lower():
            return "ngram"
        return self.draft_name or "draft model"

    @cached_property
    def weights_bytes(self) -> int:
        """The target's parameters and buffers in memory (the draft's not included)."""
        return _tensor_bytes(self.engine.runner.model)

    @cached_property
    def draft_weights_bytes(self) -> int:
        runner = getattr(self.engine.speculator, "runner", None)
        return _tensor_bytes(runner.model) if runner is not None else 0

    def piece(self, token_id: int) -> str:
        """A token's text as the user would read it (special tokens kept)."""
        return self.engine.tokenizer.token_text(token_id)

    def owns(self, request_id: str) -> bool:
        """Whether this engine ran a request whose trace is kept (one store may serve every model)."""
        return request_id in self.store and self.store.model_of(request_id) in (None, self.model_name)

    def is_special(self, token_id: int) -> bool:
        return token_id in self.engine.tokenizer.special_ids

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> "EngineService":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.engine.shutdown()  # a sharded engine's worker ranks (nothing for one device)

    # --- requests -------------------------------------------------------------------
    def submit(self, sub: Submission, request_id: str | None = None, client: str | None = None) -> Subscription:
        """Queue a request and return its subscription. ValueError: the server's limits
        (RequestRefused: max_tokens cap, this client's requests in flight) or the engine
        refused it (the subscription is dropped again). `client`: who counts against the
        per-client cap (None: not counted)."""
        rid = request_id or f"req-{next(_ids)}-{secrets.token_hex(4)}"  # unguessable: ids open traces and rooms
        if sub.prompt is None and not self.engine.tokenizer.has_chat_template:
            raise RequestRefused(f"the model {self.model_name!r} has no chat template (a base model): send a plain "
                                 "prompt (POST /v1/completions) instead of chat messages", param="messages")
        cap = self.limits.max_tokens_cap
        if cap is not None and sub.params.max_tokens > cap:
            raise RequestRefused(f"max_tokens {sub.params.max_tokens} is above this server's cap of {cap}",
                                 param="max_tokens")
        sub = self._fit_context(sub)
        self.slots.acquire(client, rid)
        watch = Subscription(rid)
        with self._subs_lock:
            self._subs.setdefault(rid, []).append(watch)  # before add_request: see its first events
        if sub.trace_level != "off":
            self.store.set_body(rid, sub.body, self.model_name)
        try:
            self.engine.add_request(prompt=sub.prompt, messages=None if sub.prompt is not None else sub.messages,
                                    params=sub.params, request_id=rid,
                                    trace_level=sub.trace_level, speculative=sub.speculative,
                                    num_speculative_tokens=sub.num_speculative_tokens)
        except Exception as e:
            self.unsubscribe(watch)
            self.slots.release(rid)
            if isinstance(e, TemplateError):  # e.g. a template that wants user/assistant turns to alternate
                raise RequestRefused(f"the model's chat template refused these messages: {e}",
                                     param="messages") from e
            raise
        self._wake.set()
        return watch

    def _fit_context(self, sub: Submission) -> Submission:
        """Refuse (400, as vLLM's server does) a max_tokens that cannot fit: prompt + max_tokens
        must not pass the context. A body without max_tokens gets the default, lowered to fit.
        (A prompt that fills the context alone is left to the engine's own message.)"""
        tok = self.engine.tokenizer
        try:
            n = len(tok.encode(sub.prompt) if sub.prompt is not None else tok.encode_chat(sub.messages))
        except TemplateError as e:
            raise RequestRefused(f"the model's chat template refused these messages: {e}", param="messages") from e
        ctx, want = self.engine.max_model_len, sub.params.max_tokens
        if n >= ctx or n + want <= ctx:
            return sub
        if sub.body is not None and sub.body.get("max_tokens") is None:
            return replace(sub, params=replace(sub.params, max_tokens=ctx - n))
        raise RequestRefused(f"max_tokens is too large: {want:,}. This model's maximum context length is {ctx:,} "
                             f"tokens and the prompt has {n:,} tokens ({want:,} > {ctx:,} - {n:,}): ask for at "
                             f"most {ctx - n:,}", param="max_tokens", code="context_length_exceeded")

    def abort(self, request_id: str) -> bool:
        """Stop a request; the engine's next step reports its end to the watchers."""
        done = self.engine.abort(request_id)  # takes the engine lock: call from a worker thread
        self.slots.release(request_id)  # its blocks are free already; its client may send another now
        self._wake.set()
        return done

    def subscribe_all(self, max_items: int | None = None) -> Subscription:
        return self.attach(Subscription(None, max_items=max_items))

    def subscribe(self, request_id: str, max_items: int | None = None) -> Subscription:
        """Watch one request (already running or not yet sent)."""
        return self.attach(Subscription(request_id, max_items=max_items))

    def attach(self, watch: Subscription) -> Subscription:
        """Feed an existing queue too (one watcher of several engines has one queue)."""
        with self._subs_lock:
            if watch.request_id is None:
                self._firehose.append(watch)
            else:
                self._subs.setdefault(watch.request_id, []).append(watch)
        return watch

    def unsubscribe(self, watch: Subscription) -> None:
        with self._subs_lock:
            if watch.request_id is None:
                if watch in self._firehose:
                    self._firehose.remove(watch)
                return
            subs = self._subs.get(watch.request_id, [])
            if watch in subs:
                subs.remove(watch)
            if not subs:
                self._subs.pop(watch.request_id, None)

    # --- the engine thread ------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.engine.has_unfinished_requests():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as e:  # keep serving: fail the live requests, not the server
                log.exception("engine step failed")
                self.error = ("engine step failed; the server log has the details" if self.limits.public
                              else f"engine step failed: {e!r}")
                self._fail_all(self.error)
                continue
            with self.engine.lock:
                self._take_snapshot()
                for rid in self._uncapture:  # between steps: the engine reads seq.capture inside one
                    seq = self.engine.requests.get(rid)
                    if seq is not None:
                        seq.capture = None
                self._uncapture.clear()
            for out in outputs:
                item = {"type": "output", "request_id": out.request_id, "token_id": out.token_id, "text": out.text,
                        "index": out.index, "t": out.time, "finished": out.finished,
                        "finish_reason": out.finish_reason, "step": self.engine.step_count}
                if out.finished:  # what any level records: an untraced request has no finish event
                    item["usage"] = self._usage(out.request_id)
                self.store.add_output(out.request_id, item)
                for listen in self.output_listeners:
                    listen(item)
                self._deliver(out.request_id, item)
                if out.finished:
                    self._finished(out.request_id)

    def _usage(self, request_id: str) -> dict | None:
        """A finished request's token counts (the prefix-cache hit included), from the engine's
        own record of it: the request's outputs carry them at every capture level."""
        seq = self.engine.requests.get(request_id)
        if seq is None:
            return None
        return {"prompt_tokens": seq.num_prompt_tokens, "completion_tokens": seq.num_output_tokens,
                "cached_tokens": seq.num_cached_tokens}

    def _release_slot(self, item: dict) -> None:
        if item["finished"]:
            self.slots.release(item["request_id"])

    def _finished(self, request_id: str) -> None:
        self.engine.release(request_id)  # its events live on in the trace store

    def _fail_all(self, message: str) -> None:
        with self.engine.lock:
            live = [rid for rid, seq in self.engine.requests.items() if not seq.is_finished]
        for rid in live:
            self.abort(rid)  # first: a client told of the error may send its next request at once
            self._deliver(rid, {"type": "error", "request_id": rid, "message": message})

    def _take_snapshot(self) -> None:
        e = self.engine
        bm = e.block_manager
        bs = e.config.block_size
        owners: dict[int, list[str]] = {}
        fill: dict[int, int] = {}
        for rid, seq in e.requests.items():
            if seq.is_finished:
                continue
            for i, b in enumerate(seq.block_table):
                owners.setdefault(b, []).append(rid)
                fill[b] = max(fill.get(b, 0), max(0, min(bs, seq.num_computed_tokens - i * bs)))
        ref = tuple(b.ref_count for b in bm.blocks)
        cached = tuple(b.hash is not None and bm.cached.get(b.hash) == b.block_id for b in bm.blocks)
        prev = self.snapshot
        if prev is not None:  # most steps change neither: share the tuples (the store keeps many snapshots)
            ref = prev.ref if prev.ref == ref else ref
            cached = prev.cached if prev.cached == cached else cached
        snap = self.snapshot = KVSnapshot(e.step_count, bm.num_blocks, bs, ref, cached, owners, fill)
        for rid, seq in e.requests.items():  # a replay draws the pool as it was at each of its steps
            if seq.traced:
                self.store.add_snapshot(rid, snap)

    # --- the tracer sink (runs inside engine.step(): keep it cheap) ------------------------
    def _on_event(self, event: TraceEvent) -> None:
        d = event.to_dict()
        d["model"] = self.model_name  # one server may serve several models: say whose event it is
        rid = d["request_id"]
        if rid is not None:
            if self.store.add(rid, d):  # its trace passed the per-request cap: no more tensor captures
                self._uncapture.add(rid)
                cut = {"schema": 1, "type": "trace.truncated", "request_id": rid, "step": d.get("step", 0),
                       "ts": d.get("ts"), "model": self.model_name,
                       "limit_bytes": self.store.max_bytes}  # watchers say so now, not only in the file
                self.store.add(rid, cut)
                self._deliver(rid, cut)
            self._deliver(rid, d)
        elif d["type"] in ("schedule.step", "schedule.collective"):  # a step's: kept with each request in it
            for b in d["batch"]:
                self.store.add(b["request_id"], d)
                self._deliver(b["request_id"], d, firehose=False)
            self._deliver(None, d)
        else:
            self._deliver(None, d)

    def _deliver(self, request_id: str | None, item: dict, firehose: bool = True) -> None:
        with self._subs_lock:
            targets = list(self._subs.get(request_id, ())) if request_id is not None else []
            if firehose:
                targets += self._firehose
        for watch in targets:
            watch.offer(item)


def _tensor_bytes(module) -> int:
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def wait_idle(service, timeout: float = 30.0) -> bool:
    """True once the engine (every engine of a ServedModels) has no unfinished request."""
    engines = [s.engine for s in getattr(service, "services", [service])]  # one engine or a ServedModels
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(e.has_unfinished_requests() for e in engines):
            return True
        time.sleep(0.02)
    return False


def split_sizes(cfg) -> list[int]:
    """The tensor-parallel sizes (2 up to the KV heads) the engine accepts for this model."""
    from engine.parallel.shard import check_shardable
    ok = []
    for n in range(2, cfg.num_kv_heads + 1):
        try:
            check_shardable(cfg, n, False)
            ok.append(n)
        except ValueError:
            pass
    return ok
