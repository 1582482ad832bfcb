"""Which prefill engine computes a request, and which decode engine receives its pages.

Prefill (at add_request): the engine that would finish this prompt soonest, counted in
prefill tokens: the tokens it has been sent and not yet answered (prefilled or refused),
plus this prompt's tokens it would compute, those past the prefix it holds cached. So a
long cached prefix wins (its tokens are skipped), unless that engine is already busier by
more than the prefix saves; with nothing cached anywhere it is the least outstanding
prefill tokens. Ties: the lowest index. The decode side cannot ask the prefill engines'
caches between steps (they are other processes), so it keeps its own record of what each
one holds, as NVIDIA Dynamo's KV router does from its workers' events: the chained block
hashes of the prompts it sent there, at most that engine's pool of them, oldest forgotten
first. An eviction there is not seen here: the record is a hint (the engine's own prefix
match decides what is skipped), never a correctness matter.

Decode (when a request's pages are ready): the decode engine with the most free blocks,
among those where the request's blocks fit now; none: it waits (in order) for blocks.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


def block_hashes(ids: list[int], block_size: int) -> list[int]:
    """One hash per full block of ids, each chained to the blocks before it (a prefix, not a
    block anywhere)."""
    out, h = [], 0
    for i in range(0, len(ids) - block_size + 1, block_size):
        h = hash((h, tuple(ids[i:i + block_size])))
        out.append(h)
    return out


@dataclass
class PrefillRecord:
    """What the router knows of one prefill engine."""
    capacity: int  # its pool's blocks: more than that cannot be cached there
    outstanding: int = 0  # prefill tokens sent, not answered yet
    cached: OrderedDict = field(default_factory=OrderedDict)  # chained block hash -> None, oldest first

    def cached_tokens(self, hashes: list[int], num_tokens: int, block_size: int) -> int:
        """Leading tokens it holds (whole blocks; one token is always computed, as engines do)."""
        n = 0
        for h in hashes:
            if h not in self.cached:
                break
            n += 1
        return min(n * block_size, (num_tokens - 1) // block_size * block_size)

    def remember(self, hashes: list[int]) -> None:
        for h in hashes:
            self.cached[h] = None
            self.cached.move_to_end(h)
        while len(self.cached) > self.capacity:
            self.cached.popitem(last=False)


@dataclass
class Route:
    index: int  # the prefill engine
    cached_tokens: int  # the prefix the router expects it to hold
    cost: int  # the prefill tokens it would have to compute, this prompt's included


class PrefillRouter:
    def __init__(self, num_engines: int, capacity_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.engines = [PrefillRecord(capacity_blocks) for _ in range(num_engines)]
        self.sent: dict[str, tuple[int, int]] = {}  # request id -> (engine, its tokens counted there)

    def route(self, request_id: str, ids: list[int]) -> Route:
        """Pick the engine for this prompt and count it there."""
        hashes = block_hashes(ids, self.block_size)
        best = None
        for i, e in enumerate(self.engines):
            cached = e.cached_tokens(hashes, len(ids), self.block_size)
            r = Route(i, cached, e.outstanding + len(ids) - cached)
            if best is None or r.cost < best.cost:
                best = r
        work = len(ids) - best.cached_tokens
        self.engines[best.index].outstanding += work
        self.engines[best.index].remember(hashes)
        self.sent[request_id] = (best.index, work)
        return best

    def answered(self, request_id: str) -> None:
        """Its prefill ended there (prefilled, refused or dropped): no longer outstanding."""
        index, work = self.sent.pop(request_id, (None, 0))
        if index is not None:
            self.engines[index].outstanding -= work

    def engine_of(self, request_id: str) -> int | None:
        got = self.sent.get(request_id)
        return None if got is None else got[0]


def pick_decode(free_blocks: list[int], needed: int) -> int | None:
    """The decode engine with the most free blocks where `needed` fit (lowest index on a tie)."""
    fits = [(-free, i) for i, free in enumerate(free_blocks) if free >= needed]
    return min(fits)[1] if fits else None
