"""The engine's requests by id: those live (waiting, running), and those finished, kept
readable (get_output) until their caller releases them."""
from __future__ import annotations

from collections import deque

from engine.sequence import Sequence


class RequestTable(dict[str, Sequence]):
    """A dict of the requests. Past max_finished finished ones the oldest are forgotten, so a
    caller that never releases cannot grow memory."""

    def __init__(self, max_finished: int = 1024) -> None:
        super().__init__()
        self.max_finished = max_finished
        self.finished_order: deque[str] = deque()  # finished request ids, oldest first

    def finished(self, request_id: str) -> None:
        """It ended: readable until released, or until max_finished newer ones ended."""
        self.finished_order.append(request_id)
        while len(self.finished_order) > self.max_finished:
            self.pop(self.finished_order.popleft(), None)

    def release(self, request_id: str) -> None:
        """Forget a finished request (its output has been collected)."""
        seq = self.get(request_id)
        if seq is not None and seq.is_finished:
            del self[request_id]

    def live(self) -> list[str]:
        """The ids of the requests not finished yet (waiting or running)."""
        return [rid for rid, seq in self.items() if not seq.is_finished]
