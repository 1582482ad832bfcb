"""Engine steps held by a test, so that what it must see while a request streams never
depends on how fast the machine is (a busy CI machine's page lags the engine by seconds,
and a paced tiny model ends 100 tokens before a slow Stop lands). Each wraps the engine's
`step` (the service's thread calls it outside the engine's lock: aborts still land)."""
from __future__ import annotations

import itertools
import queue
import threading
from dataclasses import dataclass, field


@dataclass
class UntilAbort:
    """After `after` engine steps, each further step waits (`wait_s` at most) until an abort
    arrives; the abort releases that wait and re-arms the hold for the next request, so
    every request of the test streams until it is stopped. `aborts`: how many arrived."""
    after: int = 8
    wait_s: float = 60
    aborts: int = 0
    aborted: list[str] = field(default_factory=list)  # the request ids, in order (a repeat counts again)
    _steps: itertools.count = field(default_factory=lambda: itertools.count(1))
    _released: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self, engine, monkeypatch) -> "UntilAbort":
        step, abort = engine.step, engine.abort

        def held_step():
            with self._lock:
                n, released = next(self._steps), self._released
            if n > self.after:
                released.wait(self.wait_s)
            return step()

        def seen_abort(request_id: str) -> bool:
            done = abort(request_id)
            with self._lock:  # the next request's steps count from one again
                self.aborts += 1
                self.aborted.append(request_id)
                self._released.set()
                self._released, self._steps = threading.Event(), itertools.count(1)
            return done
        monkeypatch.setattr(engine, "step", held_step)
        monkeypatch.setattr(engine, "abort", seen_abort)
        return self


@dataclass
class StepGate:
    """The engine stops before its step number k (counted from install, every k in `at`)
    until the test calls release(): `reached(timeout)` -> k when the engine waits there
    (its k - 1 steps done, every event of them sent). An unreleased gate opens after
    `wait_s`, so a failing test does not hang the server for the module's next tests."""
    at: tuple[int, ...]
    wait_s: float = 60
    _arrived: queue.Queue = field(default_factory=queue.Queue)
    _go: dict[int, threading.Event] = field(default_factory=dict)

    def install(self, engine, monkeypatch) -> "StepGate":
        step, steps = engine.step, itertools.count(1)
        self._go = {k: threading.Event() for k in self.at}

        def gated_step():
            k = next(steps)
            if k in self._go:
                self._arrived.put(k)
                self._go[k].wait(self.wait_s)
            return step()
        monkeypatch.setattr(engine, "step", gated_step)
        return self

    def reached(self, timeout_s: float = 120) -> int:
        return self._arrived.get(timeout=timeout_s)

    def release(self, k: int) -> None:
        self._go[k].set()

    def release_all(self) -> None:
        for go in self._go.values():
            go.set()


@dataclass
class UntilSubmitted:
    """No engine step runs until `n` requests were submitted to the service (`wait_s` at
    most, once): they share their batches however late the last one arrives."""
    n: int = 2
    wait_s: float = 60
    _count: itertools.count = field(default_factory=itertools.count)
    _all_in: threading.Event = field(default_factory=threading.Event)

    def install(self, service, monkeypatch) -> "UntilSubmitted":
        submit, step = service.submit, service.engine.step

        def counted_submit(*args, **kwargs):
            watch = submit(*args, **kwargs)
            if next(self._count) + 1 >= self.n:
                self._all_in.set()
            return watch

        def held_step():
            if not self._all_in.wait(self.wait_s):
                self._all_in.set()  # one wait in all: a failing test does not crawl a step a minute
            return step()
        monkeypatch.setattr(service, "submit", counted_submit)
        monkeypatch.setattr(service.engine, "step", held_step)
        return self


@dataclass
class HeldInside:
    """The engine's step number k waits inside the engine's lock (where a Stop's abort must wait
    for it) until release(); `steps`: every step's request ids, in order, counted from install."""
    k: int
    wait_s: float = 60
    steps: list = field(default_factory=list)
    _arrived: threading.Event = field(default_factory=threading.Event)
    _go: threading.Event = field(default_factory=threading.Event)

    def install(self, engine, monkeypatch) -> "HeldInside":
        step_in = engine._step_in

        def held(lane):
            self.steps.append({s.request_id for s in lane.scheduler.running})
            if len(self.steps) == self.k:
                self._arrived.set()
                self._go.wait(self.wait_s)
            return step_in(lane)
        monkeypatch.setattr(engine, "_step_in", held)
        return self

    def reached(self, timeout_s: float = 120) -> bool:
        return self._arrived.wait(timeout_s)

    def release(self) -> None:
        self._go.set()


@dataclass
class AfterFinish:
    """The engine's first step call after the one that returned a finished output waits until
    the test calls go.set() (`reached` is set when it waits there): what a request's client and
    page have once its answer is over, before the work after it (the logit lenses of its tokens,
    then its trace's `finish` event). An unreleased hold opens after `wait_s`."""
    wait_s: float = 60
    reached: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)
    _finished: bool = False

    def install(self, engine, monkeypatch) -> "AfterFinish":
        step = engine.step

        def held_step():
            if self._finished and not self.reached.is_set():
                self.reached.set()
                self.go.wait(self.wait_s)
            out = step()
            self._finished = self._finished or any(o.finished for o in out)
            return out
        monkeypatch.setattr(engine, "step", held_step)
        return self
