"""When a traced request's trace ends: at its engine `finish` event, which may come after the
client's last output (its tokens' logit lenses are computed after it, off the stream's path:
engine/trace/lens_queue.py). The store is given the finished output only once that event is
in, so a trace the store calls finished (packed, written to the database, exported, replayed,
pushed to a classroom) holds every token's lens; the client is told at once."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class TraceEnds:
    traced: set[str] = field(default_factory=set)  # arrived traced, no `finish` event yet
    held: dict[str, dict] = field(default_factory=dict)  # their finished output, until it comes
    lock: threading.Lock = field(default_factory=threading.Lock)  # an abort's finish comes from its caller's thread

    def event(self, request_id: str, type: str) -> dict | None:
        """A trace event: the finished output it releases to the store, if any."""
        if type not in ("request.arrive", "finish"):
            return None
        with self.lock:
            if type == "request.arrive":
                self.traced.add(request_id)
                return None
            self.traced.discard(request_id)
            return self.held.pop(request_id, None)

    def hold(self, item: dict) -> bool:
        """A streamed output: True if the store must wait for its request's `finish` event."""
        if not item["finished"]:
            return False
        with self.lock:
            if item["request_id"] not in self.traced:
                return False
            self.held[item["request_id"]] = item
            return True

    def open(self, request_ids) -> bool:
        """Whether any of these requests' traces still waits for its `finish` event."""
        with self.lock:
            return any(r in self.traced for r in request_ids)

    def release_all(self) -> list[dict]:
        """The held outputs (the engine failed: no finish event will come)."""
        with self.lock:
            held, self.held = list(self.held.values()), {}
            self.traced.clear()
            return held
