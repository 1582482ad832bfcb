"""When a `full` trace's per-token events are built: the step keeps their raw tensors, the
events come later, mostly off the stream's path (as the logit lens: lens_queue).

Building a token's `sample`, `embed`, `attention` and `moe` events (the sampler's stats
over the vocabulary, zlib of the attention rows, the routing as lists, the dicts) costs
the embedded MoE model more than its own decode step. So a step keeps, per traced request,
what those events are made of (the logits row, the pass's attention probabilities,
embedding rows and routing: small tensors and lists, no copy of the KV cache) and a
builder; the events are built:
  - live, for a request's NEWEST step, when its last live one is `live_seconds` old
    (the lens's rule, decided once a step for both: the page shows the newest pass whose
    lens is in, and that pass then has every capture; 0: every step's, as before; None:
    none while it runs);
  - when more than MAX_PENDING_BYTES wait for a request, its oldest (memory stays bounded);
  - after its last token, before its `finish` event (StepTrace.drain), in step order, each
    stamped with the step that captured it (its time is when it is built: a trace's events
    come in time order): the events of a finished trace are the ones a step would have built.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from engine.trace.events import Event
from engine.trace.live_clock import LiveClock

MAX_PENDING_BYTES = 64 * 2**20  # a request's kept tensors waiting (SmolLM2's logits row: 197 KB a token)


@dataclass(slots=True)
class Later:
    """One event (or a pass's events of one kind: its MoE layers'), not built yet: its builder (it
    returns None or [] where the capture was empty), its step."""
    build: Callable[[], Event | list[Event] | None]
    step: int
    nbytes: int  # what it holds on to
    where: tuple[int, int]  # its pass's first position and the answer tokens made (a trace.truncated's, if
    # a reader's byte cap is met as it is emitted: the captures stop at that pass)
    kind: str  # its TraceCosts kind: `sampling` for the `sample` event, else a tensor capture (a cap drops it)

    @property
    def captured(self) -> bool:
        return self.kind != "sampling"


@dataclass
class CaptureQueue:
    max_pending_bytes: int = MAX_PENDING_BYTES
    pending: dict[str, list[Later]] = field(default_factory=dict)  # request id -> its events, in order
    held_bytes: dict[str, int] = field(default_factory=dict)
    live: LiveClock = field(default_factory=LiveClock)

    def due(self, request_id: str, live_seconds: float | None) -> bool:
        """Whether this step's events of the request are built live (the lens's rule where it has
        no lens: its own clock)."""
        return live_seconds is not None and self.live.due(request_id, live_seconds)

    def keep(self, request_id: str, later: Later) -> list[Later]:
        """Queue one event; returns the oldest ones due now where the request holds too much."""
        queue = self.pending.setdefault(request_id, [])
        queue.append(later)
        held = self.held_bytes.get(request_id, 0) + later.nbytes
        self.held_bytes[request_id] = held
        if held <= self.max_pending_bytes:
            return []
        return self.take(request_id, max(1, len(queue) // 2))

    def take(self, request_id: str, n: int | None = None) -> list[Later]:
        """The oldest n (None: all) of the request's waiting events, out of the queue."""
        queue = self.pending.get(request_id, [])
        n = len(queue) if n is None else n
        out, rest = queue[:n], queue[n:]
        if rest:
            self.pending[request_id] = rest
            self.held_bytes[request_id] -= sum(x.nbytes for x in out)
        else:
            self.pending.pop(request_id, None)
            self.held_bytes.pop(request_id, None)
        return out

    def take_until(self, request_id: str, step: int) -> list[Later]:
        """The request's waiting events of steps up to `step`, out of the queue."""
        queue = self.pending.get(request_id, [])
        n = next((i for i, x in enumerate(queue) if x.step > step), len(queue))
        return self.take(request_id, n)

    def waits(self, request_id: str) -> bool:
        return bool(self.pending.get(request_id))

    def end(self, request_id: str) -> None:
        self.live.forget(request_id)

    def stop(self, request_id: str) -> list[Later]:
        """A reader cut the request's captures: its waiting tensor captures go; its `sample`
        events stay. Returns every event that waited (their steps say where the captures end)."""
        waiting = self.pending.pop(request_id, [])
        self.held_bytes.pop(request_id, None)
        for x in waiting:
            if not x.captured:
                self.keep(request_id, x)
        return waiting
