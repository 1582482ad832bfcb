"""When a running request's step is built live (its events, its logit lens) rather than kept
for after its last token: the page shows the newest pass within its update bound while the
rest waits. One clock for the captures' queue and the lens's (CaptureQueue, LensQueue)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class LiveClock:
    last: dict[str, float] = field(default_factory=dict)  # request id -> when its last live step was

    def due(self, request_id: str, period: float) -> bool:
        """Whether the request's step is live now: its last live one is at least `period` s old
        (0: every step; the first always). If so, now is its last."""
        now = time.perf_counter()
        if now - self.last.get(request_id, -1e9) >= period:
            self.last[request_id] = now
            return True
        return False

    def forget(self, request_id: str) -> None:
        self.last.pop(request_id, None)

    def __len__(self) -> int:  # the running requests it times
        return len(self.last)
