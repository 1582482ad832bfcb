"""What a `full` trace's steps that are not live leave for later, in order: the keeping of
their tokens' and captures' events (CaptureQueue, LensQueue), whose events are built after
the request's last token anyway. Run together (StepTrace.flush) before anything reads the
queues (a cut, the drain, which takes a finished request's a slice at a time) or past MAX_BYTES.

Why: right after a pass each Python and torch call of the trace runs cold (the pass streamed
the weights through the caches): the keeping cost the embedded MoE ~30 us a token of its
~1 ms step at batch 1; deferred, ~2 us (2026-12-07). Live steps keep theirs at once: they
build their events then. Tried and left: holding a quiet step's own events (schedule, KV
fills, tokens, kv.pool) for 20 ms and emitting them together: the held work cost ~40 us a
step run together against ~50 cold, for events that come late."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

DRAIN_ITEMS = 48  # a finished request's items a drain call runs (~0.5 ms on the embedded MoE)
MAX_BYTES = 64 * 2**20  # what the waiting items hold on to (logits and lens rows, attention), about, before
# they run (a request's queues bound theirs alike): SmolLM2 at batch 1, ~190 steps; the embedded MoE ~2,000


@dataclass
class Deferred:
    items: list[tuple[str | None, Callable, tuple, int]] = field(default_factory=list)  # (request, work, arguments,
    # what it holds)
    ended: dict[str, list[tuple[Callable, tuple, int]]] = field(default_factory=dict)  # finished requests' items
    nbytes: int = 0  # what the items (and the finished requests' items not run yet) hold, about

    def add(self, request_id: str, work: Callable, args: tuple, nbytes: int) -> bool:
        """Work for later, holding about nbytes; True where it is time to run it all (MAX_BYTES)."""
        self.items.append((request_id, work, args, nbytes))
        self.nbytes += nbytes
        return self.nbytes >= MAX_BYTES

    def run(self) -> None:
        """Every waiting item, the finished requests' first (each request's in its order)."""
        ended, self.ended = self.ended, {}
        items, self.items, self.nbytes = self.items, [], 0
        for mine in ended.values():
            for work, args, _ in mine:
                work(*args)
        for _, work, args, _ in items:
            work(*args)

    def end(self, request_id: str) -> bool:
        """The request finished: its items wait apart (run_ended: a slice at a time, so its client's
        last token waits for none of them). True where it has any."""
        mine = [(work, args, n) for rid, work, args, n in self.items if rid == request_id]
        if mine:
            self.items = [item for item in self.items if item[0] != request_id]
            self.ended[request_id] = mine
        return bool(mine)

    def run_ended(self, request_id: str, n: int) -> bool:
        """The oldest n items of a finished request, what they held no longer counted (else the
        count grows with every finished request, and MAX_BYTES runs every queue in the middle of
        a live request's stream); True where some still wait."""
        mine = self.ended.get(request_id)
        if not mine:
            return False
        todo, rest = mine[:n], mine[n:]
        if rest:
            self.ended[request_id] = rest
        else:
            del self.ended[request_id]
        for work, args, held in todo:
            self.nbytes -= held
            work(*args)
        return bool(rest)
