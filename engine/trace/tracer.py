"""Trace events: what the engine tells the outside world about each stage.

One small interface: `tracer.emit(type, request_id, step, **data)`, or `emit_plain` with
data already converted to JSON values (the engine's events, each built by its function in
engine/trace/events.py); a `Tracer` turns that into a `TraceEvent` and hands it to its
sinks. Event types begin with a stage name (see STAGES and ARCHITECTURE.md's journey),
e.g. `kv.alloc`. With no tracer the engine builds no payloads at all.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

SCHEMA_VERSION = 1
STAGES = ("request", "prefix_cache", "tokenize", "embed", "attention", "moe", "kv",
          "schedule", "logit_lens", "sample", "spec", "token", "finish",
          "trace")  # trace.truncated: a reader's byte cap stopped the request's tensor captures
TRACE_LEVELS = ("off", "basic", "full")  # full adds tensors: embeddings, attention, MoE routing
# key columns kept from position 0 on when a context outgrows max_keys: the attention sink
# (most heads park weight on the first token) and the system prompt's start
FIRST_KEYS = 8
LIVE_LENS_S = 0.2  # CaptureConfig.lens_live_seconds's default: the page's


@dataclass
class CaptureConfig:
    """Bounds on what a `full` trace records, so a long prompt cannot exhaust memory."""
    attention_layers: list[int] | None = None  # None: every layer
    heads: list[int] | None = None  # None: every query head
    max_keys: int = 64  # last N query rows / key columns of each attention matrix
    first_keys: int = FIRST_KEYS  # of those key columns, the first positions kept (capture.key_window)
    embed_dims: int = 64  # leading columns of each embedding row
    top_candidates: int = 8  # sampler candidates shown per stage
    logit_lens_top: int = 5  # candidates per layer in the logit lens (engine/trace/logit_lens.py); 0: no lens
    # a running request's newest token's lens computed when its last live one is this old (LensQueue; the
    # tokens between wait, and come after its last token, before its `finish`): 0.2 s keeps the page's pass
    # panels within their 0.5 s update bound (benchmarks.measure); 0: every token's after its step; None:
    # none while it runs
    lens_live_seconds: float | None = LIVE_LENS_S
    compact: bool = True  # attention and embedding rows stored compactly (engine/trace/compact.py), else as lists


@dataclass(slots=True)
class TraceEvent:
    type: str
    request_id: str | None
    step: int
    ts: float  # time.perf_counter(): monotonic seconds
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, "type": self.type, "request_id": self.request_id,
                "step": self.step, "ts": self.ts, **self.data}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TraceEvent":
        d = dict(d)
        d.pop("schema", None)
        return cls(d.pop("type"), d.pop("request_id"), d.pop("step"), d.pop("ts"), d)


def jsonable(x: Any) -> Any:
    """Tensors to (rounded) lists so every event survives json.dumps. Plain values are
    passed through without a call each: this runs for every event of a traced step."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.is_floating_point():
            x = torch.round(x.double(), decimals=4)  # float64: short JSON (see capture.rounded)
        return x.tolist()
    if isinstance(x, dict):
        return {k: v if isinstance(v, _PLAIN) else jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [v if isinstance(v, _PLAIN) else jsonable(v) for v in x]
    return x


_PLAIN = (int, float, str, bool, type(None))
_KNOWN_TYPES: set[str] = set()  # event types whose stage emit_plain has checked


class Tracer:
    """Fan-out of events to sinks (callables). Thread-safe: the engine may run in a
    worker thread while sinks are added from a web server."""

    def __init__(self, *sinks: Callable[[TraceEvent], None]) -> None:
        self._sinks = tuple(sinks)  # replaced, never mutated: emit reads it without the lock
        self._lock = threading.Lock()

    def add_sink(self, sink: Callable[[TraceEvent], None]) -> None:
        with self._lock:
            self._sinks = self._sinks + (sink,)

    def remove_sink(self, sink: Callable[[TraceEvent], None]) -> None:
        with self._lock:
            if sink in self._sinks:
                sinks = list(self._sinks)
                sinks.remove(sink)
                self._sinks = tuple(sinks)

    def emit(self, type: str, request_id: str | None, step: int, **data: Any) -> TraceEvent:
        return self.emit_plain(type, request_id, step, jsonable(data))

    def emit_plain(self, type: str, request_id: str | None, step: int, data: dict[str, Any],
                   ts: float | None = None) -> TraceEvent:
        """`emit` for data already made of JSON values (e.g. from `Tensor.tolist()`): no
        walk over it, which for captured tensors would cost as much as capturing them.
        ts: when it happened, if not now (another process's event, forwarded: engine/disagg)."""
        if type not in _KNOWN_TYPES:  # (checked once a type: this runs for every event)
            if type.split(".", 1)[0] not in STAGES:
                raise ValueError(f"unknown trace stage in event type {type!r}")
            _KNOWN_TYPES.add(type)
        event = TraceEvent(type, request_id, step, time.perf_counter() if ts is None else ts, data)
        for sink in self._sinks:
            sink(event)
        return event


class EventList:
    """A sink that keeps events (for tests, `LLM.stream` and trace files)."""

    def __init__(self) -> None:
        self.events: list[TraceEvent] = []

    def __call__(self, event: TraceEvent) -> None:
        self.events.append(event)

    def of(self, request_id: str | None = None, prefix: str = "") -> list[TraceEvent]:
        return [e for e in self.events
                if (request_id is None or e.request_id == request_id) and e.type.startswith(prefix)]
