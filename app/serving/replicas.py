"""N replicas of one served model (`--replicas N`): N EngineServices, each its own engine,
KV pool and engine thread, behind one served name and a Router.

A ReplicaSet stands where one EngineService would (ServedModels, the API, the page): a
request is routed at submit, then everything about it (watching, abort) goes to the replica
that runs it. The model's facts (tokenizer, describe()) are the same on every replica and
read from the first. Each request's route is in its trace: request.arrive's `replica`.
"""
from __future__ import annotations

import itertools
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from threading import Lock

from app.serving.engine_service import EngineService, Subscription
from app.serving.requests import Submission
from app.serving.router import Route, Router
from engine import Engine, LLMEngine

MAX_REPLICAS = 4
KEEP_ROUTES = 4096  # request id -> replica, for watchers and aborts (the oldest forgotten first)
_ids = itertools.count(1)


@dataclass(frozen=True)
class Counted:
    """A replica as the router sees it here: the requests this set sent it that have not ended
    (counted as they go and end, never waiting for its engine's lock: a step can last seconds),
    and the prefix it holds of a prompt: in its engine's cache, or on its way there (a request
    sent to it, not ended, with the same beginning: its full blocks are cached once its prefill
    runs). The second part is what SGLang's router keeps too (a tree of what it routed): without
    it, a burst of requests sharing a new system prompt would be spread before the first's
    prefill has run, and every replica would compute that prompt."""
    live: set[str]
    prompts: dict[str, list[int]]  # request id -> its prompt's ids, while it runs
    engine: Engine
    block_size: int

    def in_flight(self) -> int:
        return len(self.live)

    def cached_prefix_tokens(self, token_ids: list[int]) -> int:
        cached = self.engine.cached_prefix_tokens(token_ids)
        coming = max((_common(token_ids, p) for p in list(self.prompts.values())), default=0)
        coming = min(coming, len(token_ids) - 1) // self.block_size * self.block_size  # whole blocks, one left
        return max(cached, coming)


class ReplicaSet:
    def __init__(self, replicas: list[EngineService], router: Router | None = None) -> None:
        if not 2 <= len(replicas) <= MAX_REPLICAS:
            raise ValueError(f"--replicas takes 2 to {MAX_REPLICAS} replicas, not {len(replicas)}")
        if len({r.model_name for r in replicas}) != 1:
            raise ValueError("the replicas of one model share its served name")
        self.replicas = list(replicas)
        for i, r in enumerate(replicas):
            r.replica = i
        self.router = router or Router()
        self._live: list[set[str]] = [set() for _ in replicas]  # each replica's running choices
        self._prompts: list[dict[str, list[int]]] = [{} for _ in replicas]  # and their prompts' ids
        self._probes = [Counted(live, prompts, r.engine, r.engine.describe().kv_pool.block_size)
                        for live, prompts, r in zip(self._live, self._prompts, replicas)]
        for live, prompts, r in zip(self._live, self._prompts, replicas):
            r.output_listeners.append(_ender(live, prompts))
        self._routes: OrderedDict[str, int] = OrderedDict()
        self._lock = Lock()  # one decision at a time: the rotation and the loads it read stay consistent
        first = replicas[0]
        self.model_name, self.store, self.limits, self.slots = first.model_name, first.store, first.limits, first.slots
        self.draft_name = first.draft_name
        self.engine = first.engine  # the model's facts; each replica's load is its own engine's

    # --- the model's facts (every replica's are the same) ---------------------------------
    def model_info(self) -> dict:
        return {**self.replicas[0].model_info(), "replicas": len(self.replicas), "router": self.router.policy}

    def draft_kind(self) -> str | None:
        return self.replicas[0].draft_kind()

    def pool(self) -> dict:
        return self.replicas[0].pool()  # before any request: the first replica's (all start empty)

    def piece(self, token_id: int) -> str:
        return self.replicas[0].piece(token_id)

    def is_special(self, token_id: int) -> bool:
        return self.replicas[0].is_special(token_id)

    def owns(self, request_id: str) -> bool:
        return any(r.owns(request_id) for r in self.replicas)

    @property
    def error(self) -> str | None:
        return next((r.error for r in self.replicas if r.error is not None), None)

    # --- routing --------------------------------------------------------------------------
    def prompt_ids(self, sub: Submission) -> list[int] | None:
        """The ids the engine will see (None if they cannot be made: the replica's engine then
        refuses the request with its own message)."""
        tok = self.engine.tokenizer
        try:
            if isinstance(sub.prompt, list):  # token ids: as they are
                return list(sub.prompt)
            if sub.prompt is not None:
                return tok.encode(sub.prompt)
            return tok.encode_chat(sub.messages)
        except Exception:  # a template that refuses these messages: submit says why
            return None

    def route(self, sub: Submission) -> Route:
        return self._route(sub)[0]

    def _route(self, sub: Submission) -> tuple[Route, list[int] | None]:
        ids = self.prompt_ids(sub)
        with self._lock:
            return self.router.choose(ids, self._probes), ids

    def replica_of(self, request_id: str) -> EngineService | None:
        with self._lock:
            i = self._routes.get(request_id.split(".")[0])  # a choice "<id>.<i>" runs with its request
        return None if i is None else self.replicas[i]

    def submit(self, sub: Submission, request_id: str | None = None, client: str | None = None,
               page: str | None = None) -> Subscription:
        route, ids = self._route(sub)
        rid = request_id or f"req-{next(_ids)}-{secrets.token_hex(4)}"  # before it runs: it may end at once
        choices = LLMEngine.choice_ids(rid, sub.params.n)
        live, prompts = self._live[route.replica], self._prompts[route.replica]
        live.update(choices)
        if ids:
            prompts[rid] = ids
        with self._lock:
            self._routes[rid] = route.replica
            while len(self._routes) > KEEP_ROUTES:
                self._routes.popitem(last=False)
        try:
            return self.replicas[route.replica].submit(sub, rid, client, route=route.as_dict(), page=page)
        except Exception:
            live.difference_update(choices)
            prompts.pop(rid, None)
            with self._lock:
                self._routes.pop(rid, None)
            raise

    def watched_from(self, request_id: str, page: str | None) -> bool:
        """EngineService.watched_from on the replica that runs the request."""
        replica = self.replica_of(request_id)
        return replica is not None and replica.watched_from(request_id, page)

    def unwatched(self, request_id: str) -> None:
        replica = self.replica_of(request_id)
        if replica is not None:  # (a route forgotten meanwhile: its engine drops the request as it ends)
            replica.unwatched(request_id)

    def abort(self, request_id: str) -> bool:
        owner = self.replica_of(request_id)
        return any([r.abort(request_id) for r in ([owner] if owner else self.replicas)])

    # --- watching -------------------------------------------------------------------------
    def subscribe_all(self, max_items: int | None = None) -> Subscription:
        return self.attach(Subscription(None, max_items=max_items))

    def subscribe(self, request_id: str, max_items: int | None = None) -> Subscription:
        return self.attach(Subscription(request_id, max_items=max_items))

    def attach(self, watch: Subscription) -> Subscription:
        """The replica that runs the request (every replica when it is not known yet: only the
        one that gets it sends its events)."""
        owner = self.replica_of(watch.request_id) if watch.request_id is not None else None
        for r in [owner] if owner else self.replicas:
            r.attach(watch)
        return watch

    def unsubscribe(self, watch: Subscription) -> None:
        for r in self.replicas:
            r.unsubscribe(watch)

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> "ReplicaSet":
        for r in self.replicas:
            r.start()
        return self

    def stop(self) -> None:
        for r in self.replicas:
            r.stop()


def _ender(live: set[str], prompts: dict[str, list[int]]):
    """An output listener (on the replica's engine thread): a finished choice leaves `live`
    (and a finished request's prompt `prompts`: its blocks are in the engine's cache now)."""
    def ended(item: dict) -> None:
        if item["finished"]:
            live.discard(item["request_id"])
            prompts.pop(item["request_id"], None)
    return ended


def _common(a: list[int], b: list[int]) -> int:
    """The length of a and b's common beginning."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]: halve (list slices compare in C)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
