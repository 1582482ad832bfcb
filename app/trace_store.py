"""A bounded store of recent requests' traces, so a page can redraw a panel after the
fact and a trace can be exported, replayed or walked through in classroom mode.

Per request it keeps the trace events (plain dicts), the streamed outputs, the JSON body
it came with, and the KV block pool after each engine step it took part in (the pool is
not in the request's own events: other requests' blocks are drawn too).

A finished request's events and outputs are packed into one JSON string: millions of
small dicts and lists kept for 32 requests would make each full garbage collection
walk them all, a pause of hundreds of milliseconds that stalls the engine and the
page alike. A string is one object the collector never looks into."""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StoredTrace:
    events: list[dict] = field(default_factory=list)
    outputs: list[dict] = field(default_factory=list)
    snapshots: list[Any] = field(default_factory=list)  # KVSnapshot objects, shared between requests
    body: dict | None = None
    dropped: int = 0
    finished: bool = False
    packed: str | None = None  # events and outputs as JSON, once finished (the lists are empty then)

    def pack(self) -> None:
        if self.packed is None:
            self.packed = json.dumps([self.events, self.outputs], separators=(",", ":"))
            self.events, self.outputs = [], []

    def unpack(self) -> None:
        if self.packed is not None:
            self.events, self.outputs = json.loads(self.packed)
            self.packed = None

    def lists(self) -> tuple[list[dict], list[dict]]:
        """Fresh lists of the events and outputs, packed or not."""
        if self.packed is not None:
            events, outputs = json.loads(self.packed)
            return events, outputs
        return list(self.events), list(self.outputs)


class TraceStore:
    def __init__(self, max_requests: int = 32, max_events_per_request: int = 50_000,
                 max_snapshots_per_request: int = 1024) -> None:
        self.max_requests = max_requests
        self.max_events = max_events_per_request
        self.max_snapshots = max_snapshots_per_request
        self._traces: OrderedDict[str, StoredTrace] = OrderedDict()
        self._lock = threading.Lock()

    def _trace(self, request_id: str) -> StoredTrace:  # call with the lock held
        tr = self._traces.get(request_id)
        if tr is None:
            tr = self._traces[request_id] = StoredTrace()
            while len(self._traces) > self.max_requests:  # oldest request goes first
                self._traces.popitem(last=False)
        return tr

    def add(self, request_id: str, event: dict) -> None:
        with self._lock:
            tr = self._trace(request_id)
            late = tr.packed is not None  # an event after the end (rare)
            tr.unpack()
            if len(tr.events) < self.max_events:
                tr.events.append(event)
            else:
                tr.dropped += 1
            if late:
                tr.pack()

    def add_output(self, request_id: str, item: dict) -> None:
        with self._lock:
            tr = self._traces.get(request_id)
            if tr is not None:  # untraced requests keep nothing
                tr.unpack()
                tr.outputs.append(item)
                tr.finished = tr.finished or item["finished"]
                if tr.finished:
                    tr.pack()

    def add_snapshot(self, request_id: str, snapshot: Any) -> None:
        with self._lock:
            tr = self._traces.get(request_id)
            if tr is None:
                return
            tr.snapshots.append(snapshot)
            if len(tr.snapshots) > self.max_snapshots:  # a long request: keep every other step's pool
                tr.snapshots[:] = tr.snapshots[::2]

    def set_body(self, request_id: str, body: dict | None) -> None:
        with self._lock:
            self._trace(request_id).body = body

    def get(self, request_id: str) -> list[dict]:
        with self._lock:
            tr = self._traces.get(request_id)
            return tr.lists()[0] if tr else []

    def trace(self, request_id: str) -> StoredTrace | None:
        """A copy of everything kept for the request (lists copied; their items are shared
        while it runs, and parsed afresh once it is packed)."""
        with self._lock:
            tr = self._traces.get(request_id)
            if tr is None:
                return None
            events, outputs = tr.lists()
            return StoredTrace(events, outputs, list(tr.snapshots), tr.body, tr.dropped, tr.finished)

    def dropped(self, request_id: str) -> int:
        with self._lock:
            tr = self._traces.get(request_id)
            return tr.dropped if tr else 0

    def request_ids(self) -> list[str]:
        with self._lock:
            return list(self._traces)

    def __contains__(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._traces
