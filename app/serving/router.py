"""Which replica of a model serves a request: round-robin, least-loaded or prefix-aware.

A prefix cache only pays when requests that share a prompt's beginning (a system prompt)
land where that beginning is cached, and that is the router's choice. prefix-aware decides
the way SGLang's cache-aware router does: the replica holding the longest cached prefix of
the request's tokens, unless the replicas' loads are far apart (then balance first); with
no prefix cached anywhere, the least loaded. Here the cache is asked, not guessed: each
replica's engine answers `cached_prefix_tokens(ids)` from its own block pool.

The policies read replicas through a two-method probe, so the server (app/serving/replicas.py)
and the routing experiment (app/lab/routing.py) route with the same code.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol, Sequence

from engine import Engine

POLICIES = ("round-robin", "least-loaded", "prefix-aware")
BALANCE_ABS = 8  # prefix-aware balances first when the loads differ by more than this many requests


class Probe(Protocol):
    def in_flight(self) -> int: ...  # requests running or waiting there

    def cached_prefix_tokens(self, token_ids: list[int]) -> int: ...


@dataclass(frozen=True)
class EngineProbe:
    """A replica as the router sees it: an engine's load and its prefix cache."""
    engine: Engine

    def in_flight(self) -> int:
        load = self.engine.load()
        return load.running + load.waiting

    def cached_prefix_tokens(self, token_ids: list[int]) -> int:
        return self.engine.cached_prefix_tokens(token_ids)


@dataclass
class Route:
    """One routing decision, as the request's trace keeps it (request.arrive's `replica`)."""
    replica: int  # 0-based
    of: int  # replicas
    policy: str
    loads: list[int] = field(default_factory=list)  # requests in flight on each replica, before this one
    cached: list[int] = field(default_factory=list)  # cached prefix tokens on each (prefix-aware only)
    prompt_tokens: int | None = None
    reason: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


class Router:
    """One policy and its rotation (round-robin's next turn, and the tie-break of the others)."""

    def __init__(self, policy: str = "prefix-aware", balance_abs: int = BALANCE_ABS) -> None:
        if policy not in POLICIES:
            raise ValueError(f"--router must be one of {', '.join(POLICIES)}, not {policy!r}")
        self.policy = policy
        self.balance_abs = balance_abs
        self._turn = 0  # the replica after the last one chosen

    def choose(self, token_ids: list[int] | None, replicas: Sequence[Probe]) -> Route:
        """The replica for a request with these prompt ids (None: unknown, e.g. it failed to
        tokenize; the replica's engine will refuse it with the proper error)."""
        n = len(replicas)
        if n == 0:
            raise ValueError("no replicas to route to")
        if self.policy == "round-robin":
            route = Route(self._turn % n, n, self.policy, reason="its turn")
        else:
            loads = [r.in_flight() for r in replicas]
            route = self._by_load(loads, n)
            if self.policy == "prefix-aware":
                route = self._by_prefix(token_ids, replicas, loads, route)
        if token_ids is not None:
            route.prompt_tokens = len(token_ids)
        self._turn = route.replica + 1
        return route

    def _least(self, loads: list[int], among: list[int]) -> int:
        """The least loaded of `among`; a tie goes to the first at or after the rotation's turn."""
        n = len(loads)
        return min(among, key=lambda i: (loads[i], (i - self._turn) % n))

    def _by_load(self, loads: list[int], n: int) -> Route:
        i = self._least(loads, list(range(n)))
        return Route(i, n, self.policy, loads, reason=f"least loaded ({loads[i]} in flight)")

    def _by_prefix(self, ids: list[int] | None, replicas: Sequence[Probe], loads: list[int],
                   least: Route) -> Route:
        if not ids:
            least.reason = "no prompt ids to look up: " + least.reason
            return least
        cached = [r.cached_prefix_tokens(ids) for r in replicas]
        least.cached = cached
        best = max(cached)
        if best == 0:
            least.reason = "no replica holds a prefix of it: " + least.reason
            return least
        if max(loads) - min(loads) > self.balance_abs:  # SGLang's guard: a hot replica is not piled on
            least.reason = f"loads {min(loads)}..{max(loads)} too far apart: " + least.reason
            return least
        i = self._least(loads, [j for j, c in enumerate(cached) if c == best])
        return Route(i, len(replicas), self.policy, loads, cached,
                     reason=f"holds the longest cached prefix ({best} tokens)")
