"""What a `full` trace's steps that are not live leave for later, in order: the keeping of
their tokens' and captures' events (CaptureQueue, LensQueue), whose events are built after
the request's last token anyway. Run together (StepTrace.flush) before anything reads the
queues (a finish, a cut, the drain) or past MAX_ITEMS.

Why: right after a pass each Python and torch call of the trace runs cold (the pass streamed
the weights through the caches): the keeping cost the embedded MoE ~30 us a token of its
~1 ms step at batch 1; deferred, ~2 us (2026-12-07). Live steps keep theirs at once: they
build their events then. Tried and left: holding a quiet step's own events (schedule, KV
fills, tokens, kv.pool) for 20 ms and emitting them together: the held work cost ~40 us a
step run together against ~50 cold, for events that come late."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

MAX_ITEMS = 768  # deferred calls before a flush (SmolLM2 at batch 1: ~250 steps, ~65 MB of logits and
# lens rows that the queues would hold anyway; a request's queues bound theirs at 64 MB)


@dataclass
class Deferred:
    items: list[tuple[Callable, tuple]] = field(default_factory=list)

    def add(self, work: Callable, args: tuple) -> bool:
        """Work for later; True where it is time to run it all (MAX_ITEMS)."""
        self.items.append((work, args))
        return len(self.items) >= MAX_ITEMS

    def run(self) -> None:
        """Every waiting item, oldest first."""
        items, self.items = self.items, []
        for work, args in items:
            work(*args)
