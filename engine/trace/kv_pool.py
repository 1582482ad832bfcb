"""The KV block pool as a trace event, `kv.pool`, emitted at the end of a step: for each
block, who holds it (request ids), its reference count, how many of its token slots its
holders have written, and whether the prefix cache can serve it.

Only the blocks that changed since the last kv.pool are sent, and only on steps where one
did. The first event is full (every block in use), and so is the first after a traced
request joins or after a step that was not looked at: the events of any one traced
request, from its arrival on, rebuild the whole pool, other requests' blocks included,
whatever ran before it (`LLM.stream` hands them over like that). Emitted while a traced
request is live (and on the step it finishes), so with tracing off there are none; or,
with `always` (a server whose pages draw the pool for untraced requests too), after every
step that changed it.

Fields: num_blocks, block_size; full (True: `blocks` lists every block in use and all
others are empty); blocks (ids, ascending) and, index for index, owners (request ids, a
list per block), ref, fill (tokens), cached; request_ids: the traced requests whose trace
the event belongs to (the live ones, and any that finished since the last event).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable

from engine.block_manager import BlockManager
from engine.sequence import Sequence
from engine.trace import events
from engine.trace.events import Event
from engine.trace.kv_holders import Holders

BlockState = tuple[tuple[str, ...], int, int, bool]  # owners, ref, fill, cached
EMPTY: BlockState = ((), 0, 0, False)


def pool_state(bm: BlockManager, holders: Holders) -> dict[int, BlockState]:
    """Every block in use (held or cached) -> its state, the holders read whole (Holders.reset).
    A block nobody holds has no references (BlockManager.check_invariants), so the live tables
    and the cache are all there is to read: the walk costs the blocks in use, not the pool's size."""
    cached = bm.cached_block_ids()
    return {b: (holders.owners(b), bm.blocks[b].ref_count, holders.fill(b), b in cached)
            for b in holders.at.keys() | cached}


def _changes(bm: BlockManager, holders: Holders, live: Iterable[Sequence],
             last: dict[int, BlockState]) -> dict[int, BlockState]:
    """What changed since `last` (updated in place) -> the changed blocks' states (EMPTY: no
    longer in use). Only the blocks that can have changed are read: those whose holders or
    written slots moved since the last look (Holders), and those the block manager touched
    since (references, the cache): on a long-running server the prefix cache holds most of the
    pool, and a long context's table most of a sequence's blocks; a step reads neither."""
    moved = holders.update(live)
    touched, bm.touched = bm.touched, set()
    changed = {}
    for b in moved | touched:
        block = bm.blocks[b]
        cached = block.hash is not None and bm.cached.get(block.hash) == b
        owners = holders.owners(b)
        state = (owners, block.ref_count, holders.fill(b), cached) if owners or cached else EMPTY
        if state != last.get(b, EMPTY):
            changed[b] = state
            if state == EMPTY:
                del last[b]
            else:
                last[b] = state
    return changed


@dataclass
class KVPoolTracker:
    """What the last kv.pool said, so the next says only what changed."""
    last: dict[int, BlockState] = field(default_factory=dict)  # the blocks in use, as last reported
    traced: tuple[str, ...] = ()  # the live traced requests the last look saw
    looked_at: int | None = None  # the step of the last look
    holders: Holders | None = None  # who held which block at the last look
    always: bool = False  # look after every step, traced requests or not
    seconds: float = 0.0  # what the looks have cost so far (the watching benchmark reads it)

    def after_step(self, bm: BlockManager, live: list[Sequence], step: int) -> Event | None:
        """The kv.pool event for the pool after `step` (live: the unfinished requests), or
        None: nothing to say (nothing changed, or nobody traced to say it to)."""
        traced = tuple(s.request_id for s in live if s.traced)
        if not traced and not self.traced and not self.always:  # untraced work only: no one to tell
            return None
        t = time.perf_counter()
        try:
            return self._look(bm, live, step, traced)
        finally:
            self.seconds += time.perf_counter() - t

    def _look(self, bm: BlockManager, live: list[Sequence], step: int, traced: tuple[str, ...]) -> Event | None:
        full = self.looked_at is None or step != self.looked_at + 1 or any(r not in self.traced for r in traced)
        to = list(dict.fromkeys(traced + self.traced))  # the live, then those just finished
        self.traced, self.looked_at = traced, step
        if full:
            self.holders = Holders(bm.block_size)
            self.holders.reset(live)
            self.last = pool_state(bm, self.holders)
            bm.touched = set()
            blocks = sorted(self.last)
            states = [self.last[b] for b in blocks]
        else:
            changed = _changes(bm, self.holders, live, self.last)
            if not changed:
                return None
            blocks = sorted(changed)
            states = [changed[b] for b in blocks]
        return events.kv_pool(bm.num_blocks, bm.block_size, full, blocks, states, to)
