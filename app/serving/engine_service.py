"""The engine service: one background thread runs the engine's step() (an Engine: an
LLMEngine or a DisaggEngine); a tracer sink copies every event into the trace store and
into the queues of whoever watches that request.

Web handlers never call step() and never wait on the engine's lock in the event loop:
they submit, then read their queue from a worker thread. The service knows the engine
only through its public methods and its events: the KV block pool, other requests' blocks
included, is what the engine's `kv.pool` events say (engine/trace/kv_pool.py).
"""
from __future__ import annotations

import itertools
import logging
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field

from jinja2 import TemplateError

from app.serving.limits import ClientSlots, RequestRefused, ServeLimits
from app.serving.requests import Submission
from app.serving.spare_core import SpareCore
from app.serving.trace_ends import TraceEnds
from app.serving.trace_store import TraceStore
from engine import ContextLengthError, Engine, LLMEngine, TraceEvent, checkout_commit
from visualizers.kv_cache import apply_kv_pool, copy_pool, empty_pool

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
    siblings: list["Subscription"] = field(default_factory=list)  # n > 1: the other choices, into this queue

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


class EngineService:
    def __init__(self, engine: Engine, store: TraceStore | None = None, model_name: str | None = None,
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
        self.replica: int | None = None  # its index among a model's replicas (set by ReplicaSet)
        self._subs: dict[str, list[Subscription]] = {}
        self._running: set[str] = set()  # submitted, not finished: their pages draw the pool live
        self.spare = SpareCore()  # the threads the engine steps with: one fewer while a page here draws
        self._routes: dict[str, dict] = {}  # a replica's live requests: how the router chose it
        self._firehose: list[Subscription] = []
        self._subs_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        kv = engine.describe().kv_pool
        self._pool = empty_pool(kv.num_blocks, kv.block_size)  # folded from the kv.pool events
        self._pool_lock = threading.Lock()
        self.output_listeners: list = []  # called on the engine thread with every output item (metrics)
        self.error: str | None = None
        self.limits = limits or ServeLimits()
        self.slots = slots or ClientSlots(self.limits.max_concurrent_per_client)
        # n > 1: choice id -> its request's id, and each request's choices still running: the client's
        # slot is the request's, freed when its last choice ends (not when choice 0 does)
        self._parent: dict[str, str] = {}
        self._open_choices: dict[str, set[str]] = {}
        self.output_listeners.append(self._release_slot)
        self._ends = TraceEnds()  # a traced request's finished output goes to the store after its `finish`
        engine.tracer.add_sink(self._on_event)

    # --- model facts the page shows (all read from the engine) -------------------
    def model_info(self) -> dict:
        """The page's and the trace file's numbers for this model, from the engine's describe()."""
        info = self.engine.describe()
        m, kv, spec, par = info.model, info.kv_pool, info.speculation, info.parallel
        return {"name": self.model_name, "num_layers": m.num_layers, "num_heads": m.num_heads,
                "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim, "hidden_size": m.hidden_size,
                "vocab_size": m.vocab_size, "num_experts": m.num_experts, "top_k": m.experts_per_token,
                "is_moe": bool(m.moe_layers), "moe_layers": list(m.moe_layers),
                "sliding_windows": list(m.sliding_windows), "dtype": m.dtype,
                "query_pre_attn_scalar": m.query_pre_attn_scalar, "mlp_activation": m.mlp_activation,
                "dtype_bytes": kv.bytes_per_value, "kv_dtype": kv.dtype, "num_blocks": kv.num_blocks,
                "block_size": kv.block_size, "kv_cache_bytes": kv.bytes,
                "max_model_len": m.max_model_len, "has_draft": spec is not None,
                "num_speculative_tokens": self.engine.num_speculative_tokens, "device": m.device,
                "architecture": m.architecture, "chat_template": self.engine.tokenizer.has_chat_template,
                "draft": self.draft_kind(), "weights_bytes": m.weights_bytes,
                "tensor_parallel_size": par.tensor_parallel_size, "expert_parallel": par.expert_parallel,
                "split_sizes": list(par.split_sizes),
                "quantization": info.quantization.summary if info.quantization else None,
                # what a KV slot holds (MLA: the latent) and DeepSeek's attention / routing settings
                "kv_stores": kv.stores, "kv_values_per_token_layer": kv.values_per_token_layer,
                "kv_bytes_per_token": kv.bytes_per_token, "kv_full_bytes_per_token": kv.full_kv_bytes_per_token,
                "mla": m.mla, "deepseek_moe": m.deepseek_moe,
                "commit": checkout_commit()}  # the code that ran it (a replay elsewhere says so: code_panel.py)

    def draft_kind(self) -> str | None:
        """None (no speculation), "ngram" (prompt lookup) or the draft model's name."""
        spec = self.engine.describe().speculation
        if spec is None:
            return None
        return "ngram" if spec.method == "ngram" else self.draft_name or "draft model"

    def pool(self) -> dict:
        """The KV block pool as the engine's last kv.pool events left it (a copy: it is what
        visualizers.kv_grid_html draws), every request's blocks included."""
        with self._pool_lock:
            return copy_pool(self._pool)

    def piece(self, token_id: int) -> str:
        """A token's text as the user would read it (special tokens kept; a piece of a
        character as its bytes)."""
        return self.engine.tokenizer.token_label(token_id)

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
    def submit(self, sub: Submission, request_id: str | None = None, client: str | None = None,
               route: dict | None = None, page: str | None = None) -> Subscription:
        """Queue a request and return its subscription. ValueError: the server's limits
        (RequestRefused: max_tokens cap, this client's requests in flight) or the engine
        refused it (the subscription is dropped again). `client`: who counts against the
        per-client cap (None: not counted); `route`: the router's decision when this engine is
        one replica of several (app/serving/replicas.py), kept in request.arrive's `replica`; `page`:
        the address of the page that sent it and draws it (a browser on this machine gets a core
        while it runs: SpareCore)."""
        rid = request_id or f"req-{next(_ids)}-{secrets.token_hex(4)}"  # unguessable: ids open traces and rooms
        if sub.prompt is None and not self.engine.tokenizer.has_chat_template:
            raise RequestRefused(f"the model {self.model_name!r} has no chat template (a base model): send a plain "
                                 "prompt (POST /v1/completions) instead of chat messages", param="messages")
        cap = self.limits.max_tokens_cap
        if cap is not None and sub.params.max_tokens > cap:
            raise RequestRefused(f"max_tokens {sub.params.max_tokens} is above this server's cap of {cap}",
                                 param="max_tokens")
        self.slots.acquire(client, rid)
        watch = Subscription(rid)
        with self._subs_lock:
            self._subs.setdefault(rid, []).append(watch)  # before add_request: see its first events
            for cid in LLMEngine.choice_ids(rid, sub.params.n)[1:]:  # n choices: one queue for all
                watch.siblings.append(Subscription(cid, watch.queue))
                self._subs.setdefault(cid, []).append(watch.siblings[-1])
                self._parent[cid] = rid
            if sub.params.n > 1:
                self._open_choices[rid] = set(LLMEngine.choice_ids(rid, sub.params.n))
            self._running.add(rid)
            self.spare.add(rid, page)
            if route is not None:
                self._routes[rid] = route
        if sub.trace_level != "off":
            self.store.set_body(rid, sub.body, self.model_name)
        # vLLM's server rule, checked by the engine as it tokenizes: prompt + max_tokens must fit the
        # context (400 otherwise); a body without max_tokens gets the default, lowered to fit
        fit = "lower" if sub.body is not None and sub.body.get("max_tokens") is None else "refuse"
        try:
            self.engine.add_request(prompt=sub.prompt, messages=None if sub.prompt is not None else sub.messages,
                                    params=sub.params, request_id=rid,
                                    trace_level=sub.trace_level, speculative=sub.speculative,
                                    num_speculative_tokens=sub.num_speculative_tokens, context_fit=fit)
        except Exception as e:
            self._routes.pop(rid, None)
            self.unsubscribe(watch)
            with self._subs_lock:
                self._running.discard(rid)
                self._open_choices.pop(rid, None)
                for cid in LLMEngine.choice_ids(rid, sub.params.n)[1:]:
                    self._parent.pop(cid, None)
            self.slots.release(rid)
            self.store.discard(rid)  # a refused request keeps no trace (its body was kept for it)
            if isinstance(e, TemplateError):  # e.g. a template that wants user/assistant turns to alternate
                raise RequestRefused(f"the model's chat template refused these messages: {e}",
                                     param="messages") from e
            if isinstance(e, ContextLengthError):
                raise RequestRefused(str(e), param="max_tokens", code="context_length_exceeded") from e
            raise
        self._wake.set()
        return watch

    def watched_from(self, request_id: str, page: str | None) -> bool:
        """A page at address `page` watches the request (Watch): one here gets a core while it runs
        (SpareCore) -> whether it did (then call unwatched when the watch ends)."""
        return self.spare.add(request_id, page)

    def unwatched(self, request_id: str) -> None:
        self.spare.drop(request_id)

    def abort(self, request_id: str) -> bool:
        """Stop a request; the engine's next step reports its end to the watchers."""
        done = self.engine.abort(request_id)  # takes the engine lock: call from a worker thread
        self._choice_ended(request_id)  # its blocks are free already; its client may send another now
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
        for sibling in watch.siblings:
            self.unsubscribe(sibling)
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
            self.spare.before_step(self._running)
            try:
                outputs = self.engine.step()
            except Exception as e:  # keep serving: fail the live requests, not the server
                log.exception("engine step failed")
                self.error = ("engine step failed; the server log has the details" if self.limits.public
                              else f"engine step failed: {e!r}")
                self._fail_all(self.error)
                continue
            for out in outputs:
                item = {"type": "output", "request_id": out.request_id, "token_id": out.token_id, "text": out.text,
                        "index": out.index, "t": out.time, "finished": out.finished,
                        "finish_reason": out.finish_reason, "step": out.step}
                if out.logprobs is not None:  # asked for (params.logprobs): plain values, as the API sends them
                    item["logprobs"] = out.logprobs.as_dict()
                if out.prompt_logprobs is not None:
                    item["prompt_logprobs"] = [None if lp is None else lp.as_dict() for lp in out.prompt_logprobs]
                    item["prompt_token_ids"] = self.engine.get_output(out.request_id).prompt_token_ids
                if out.finished:  # what any level records: an untraced request has no finish event
                    item["usage"] = self._usage(out.request_id)
                if not self._ends.hold(item):
                    self.store.add_output(out.request_id, item)
                for listen in self.output_listeners:
                    listen(item)
                self._deliver(out.request_id, item)
                if out.finished:
                    self._finished(out.request_id)

    def _usage(self, request_id: str) -> dict | None:
        """A finished request's token counts (the prefix-cache hit included), from the engine's
        own record of it: the request's outputs carry them at every capture level."""
        try:
            u = self.engine.get_output(request_id).usage
        except KeyError:
            return None
        return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                "cached_tokens": u.cached_tokens}

    def _release_slot(self, item: dict) -> None:
        if item["finished"]:
            self._choice_ended(item["request_id"])

    def _choice_ended(self, request_id: str) -> None:
        """A request (or one of its n choices) ended: its client's slot is free once every choice has
        (idempotent: an abort and its finish both come here)."""
        with self._subs_lock:
            rid = self._parent.get(request_id, request_id)
            left = self._open_choices.get(rid)
            if left is not None:
                left.discard(request_id)
                if left:
                    return
                del self._open_choices[rid]
                for cid in [c for c, r in self._parent.items() if r == rid]:
                    del self._parent[cid]
        self.slots.release(rid)

    def trace_open(self, request_id: str, n: int = 1) -> bool:
        """Whether a request's trace (any of its n choices') has not ended yet: its `finish` event
        follows the logit lenses computed after its last token; the store has it whole after."""
        return self._ends.open([request_id] + [f"{request_id}.{i}" for i in range(1, n)])

    def _finished(self, request_id: str) -> None:
        self.engine.release(request_id)  # its events live on in the trace store
        with self._subs_lock:
            self._running.discard(request_id)
            self._routes.pop(request_id, None)

    def _fail_all(self, message: str) -> None:
        for item in self._ends.release_all():  # no `finish` event will come for these
            self.store.add_output(item["request_id"], item)
        for rid in self.engine.live_requests():
            self.abort(rid)  # first: a client told of the error may send its next request at once
            self._deliver(rid, {"type": "error", "request_id": rid, "message": message})

    # --- the tracer sink (runs inside engine.step(): keep it cheap) ------------------------
    def _on_event(self, event: TraceEvent) -> None:
        d = event.to_dict()
        d["model"] = self.model_name  # one server may serve several models: say whose event it is
        rid = d["request_id"]
        if self._routes and d["type"] == "request.arrive":  # a replica's: which one, and why (the router's)
            route = self._routes.get(rid) or self._routes.get(rid.split(".")[0])
            if route is not None:
                d["replica"] = route
        if rid is not None:
            if self.store.add(rid, d):  # its trace passed the per-request cap: no more tensor captures,
                # and the engine's trace.truncated event (through this sink) tells the watchers now
                self.engine.stop_captures(rid, self.store.max_bytes)
            held = self._ends.event(rid, d["type"])
            if held is not None:  # its trace is complete: the store ends it before a watcher hears so
                self.store.add_output(rid, held)
            self._deliver(rid, d)
        elif d["type"] in ("schedule.step", "schedule.collective"):  # a step's: kept with each request in it
            for b in d["batch"]:
                self.store.add(b["request_id"], d)
                self._deliver(b["request_id"], d, firehose=False)
            self._deliver(None, d)
        elif d["type"] in ("kv.pool", "kv.decode_pool"):  # kept with the traced requests it names; every
            if d["type"] == "kv.pool":  # watcher draws it (kv.decode_pool: decode engine j > 0's, disaggregated)
                with self._pool_lock:
                    self._pool = apply_kv_pool(self._pool, d)
            for r in d["request_ids"]:
                self.store.add(r, d)
            with self._subs_lock:  # untraced requests' pages too: their KV panel is live
                to = [r for r in dict.fromkeys([*d["request_ids"], *self._running]) if r in self._subs]
            for r in to:
                self._deliver(r, d, firehose=False)
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


def wait_idle(service, timeout: float = 30.0) -> bool:
    """True once the engine (every engine of a ServedModels) has no unfinished request."""
    engines = [r.engine for s in getattr(service, "services", [service])  # one engine or a ServedModels,
               for r in getattr(s, "replicas", [s])]  # a replicated model's every replica
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(e.has_unfinished_requests() for e in engines):
            return True
        time.sleep(0.02)
    return False
