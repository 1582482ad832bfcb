"""A bounded store of recent requests' trace events (plain dicts), so a page can redraw
a panel after the fact and a trace can later be exported or replayed."""
from __future__ import annotations

import threading
from collections import OrderedDict


class TraceStore:
    def __init__(self, max_requests: int = 32, max_events_per_request: int = 50_000) -> None:
        self.max_requests = max_requests
        self.max_events = max_events_per_request
        self._traces: OrderedDict[str, list[dict]] = OrderedDict()
        self._dropped: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, request_id: str, event: dict) -> None:
        with self._lock:
            events = self._traces.get(request_id)
            if events is None:
                events = self._traces[request_id] = []
                while len(self._traces) > self.max_requests:  # oldest request goes first
                    old, _ = self._traces.popitem(last=False)
                    self._dropped.pop(old, None)
            if len(events) < self.max_events:
                events.append(event)
            else:
                self._dropped[request_id] = self._dropped.get(request_id, 0) + 1

    def get(self, request_id: str) -> list[dict]:
        with self._lock:
            return list(self._traces.get(request_id, ()))

    def dropped(self, request_id: str) -> int:
        with self._lock:
            return self._dropped.get(request_id, 0)

    def request_ids(self) -> list[str]:
        with self._lock:
            return list(self._traces)

    def __contains__(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._traces
