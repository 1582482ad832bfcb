"""The paged KV cache's bookkeeping: a fixed pool of blocks, a block table per
sequence, reference counts, and the prefix cache.

Prefix cache: every full block is keyed by a hash chain (the parent block's hash and
this block's token ids), so a key names the whole prefix up to that block. Ids are
compared on a hit, so a hash collision cannot serve wrong K/V. Blocks nobody
references stay cached in the free list, least recently used first in line for reuse.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from engine.sequence import Sequence
from engine.trace import events
from engine.trace.events import Event

Emit = Callable[[Event], None]  # the engine's: emit(events.kv_alloc(...))


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()
    parent: int | None = None  # the previous block's chain hash, checked on a hit too


def chain_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent if parent is not None else -1, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 emit: Emit | None = None) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # chain hash -> block id
        self.emit = emit
        # blocks whose references or cache entry changed since the pool's trace last took them
        # (engine/trace/kv_pool.py: a step's kv.pool looks at these and the live tables, not the pool)
        self.touched: set[int] = set()

    # --- queries ---------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.cached)

    def cached_block_ids(self) -> set[int]:
        """Blocks the prefix cache can serve now, held by a request or free (the trace's kv.pool)."""
        return set(self.cached.values())

    @property
    def num_free_cached_blocks(self) -> int:
        """Unreferenced blocks that still hold a cached prefix (free, but reusable until evicted)."""
        return sum(1 for bid in self.cached.values() if self.blocks[bid].ref_count == 0)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding the longest full-block prefix of seq (at least one token
        is always left to compute, since its logits are needed)."""
        return self.match_tokens(seq.token_ids)

    def match_tokens(self, token_ids: list[int]) -> list[int]:
        """match_prefix for bare token ids (a router asks before any sequence exists)."""
        if not self.prefix_caching:
            return []
        hits, parent = [], None
        bs = self.block_size
        for i in range((len(token_ids) - 1) // bs):
            ids = tuple(token_ids[i * bs:(i + 1) * bs])
            h = chain_hash(parent, ids)
            bid = self.cached.get(h)
            if bid is None or self.blocks[bid].token_ids != ids or self.blocks[bid].parent != parent:
                break
            hits.append(bid)
            parent = h
        return hits

    def blocks_needed(self, seq: Sequence, num_new_tokens: int, hits: list[int] | None = None) -> int:
        """Free blocks consumed by computing num_new_tokens more (after taking `hits`)."""
        if hits is not None:  # admission: the table starts as the hits
            revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)
            return revived + self.blocks_for(len(hits) * self.block_size + num_new_tokens) - len(hits)
        return max(0, self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table))

    # --- changes ---------------------------------------------------------------
    def admit(self, seq: Sequence, hits: list[int]) -> None:
        """Give a new (or preempted) sequence the cached blocks of its prefix."""
        for bid in hits:
            block = self.blocks[bid]
            if block.ref_count == 0:
                del self.free[bid]
            block.ref_count += 1
        self.touched.update(hits)
        seq.block_table = list(hits)
        seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size
        if self.emit and seq.traced:
            self.emit(events.prefix_cache_lookup(seq, hits, self.block_size, [self.blocks[b].hash for b in hits]))
            if hits:
                self.emit(events.kv_share(seq, hits))

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        new = [self._take(seq) for _ in range(self.blocks_needed(seq, num_new_tokens))]
        for bid in new:
            self.blocks[bid].ref_count = 1
        self.touched.update(new)
        seq.block_table.extend(new)
        if self.emit and seq.traced and new:
            self.emit(events.kv_alloc(seq, new))

    def commit_full_blocks(self, seq: Sequence, old_computed: int, token_ids: list[int] | None = None) -> list[int]:
        """After a forward pass: register blocks that just became full in the prefix cache.
        token_ids: the sequence's tokens if they are not all in seq.token_ids yet."""
        bs = self.block_size
        token_ids = seq.token_ids if token_ids is None else token_ids
        done = []
        for i in range(old_computed // bs, seq.num_computed_tokens // bs):
            block = self.blocks[seq.block_table[i]]
            if block.hash is not None:
                continue  # came from the cache already
            parent = self.blocks[seq.block_table[i - 1]].hash if i else None
            ids = tuple(token_ids[i * bs:(i + 1) * bs])
            block.hash, block.token_ids, block.parent = chain_hash(parent, ids), ids, parent
            if self.prefix_caching and block.hash not in self.cached:
                self.cached[block.hash] = block.block_id
            done.append(block.block_id)
        self.touched.update(done)
        return done

    def free_seq(self, seq: Sequence) -> None:
        """Drop all of seq's references."""
        self._release(seq, 0, events.kv_free)

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Keep only the blocks that num_tokens need (rejected speculative tokens)."""
        self._release(seq, self.blocks_for(num_tokens), events.kv_rollback)

    def _release(self, seq: Sequence, keep: int, event: Callable[..., Event]) -> None:
        """Drop seq's references to its blocks past the first `keep`. Tail blocks go back
        first, so under pressure a shared prefix outlives the suffixes that follow it."""
        dropped = seq.block_table[keep:]
        if not dropped:
            return
        freed, kept = [], []
        self.touched.update(dropped)
        for bid in reversed(dropped):
            block = self.blocks[bid]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash is not None and self.cached.get(block.hash) == bid:
                    self.free[bid] = None  # most recently used end
                    kept.append(bid)
                else:
                    self._reset(block)
                    self.free[bid] = None
                    self.free.move_to_end(bid, last=False)  # reuse plain blocks first
                freed.append(bid)
        if self.emit and seq.traced:
            self.emit(event(seq, freed, kept, len(dropped) - len(freed)))
        del seq.block_table[keep:]

    def _take(self, seq: Sequence) -> int:
        """The free list's head; a cached block there is evicted (told to seq's trace)."""
        bid, _ = self.free.popitem(last=False)
        self.touched.add(bid)
        block = self.blocks[bid]
        if block.hash is not None:
            if self.cached.get(block.hash) == bid:
                del self.cached[block.hash]
                if self.emit and seq.traced:
                    self.emit(events.kv_evict(seq, bid))
            self._reset(block)
        return bid

    @staticmethod
    def _reset(block: Block) -> None:
        block.hash, block.token_ids, block.parent = None, (), None

    def check_invariants(self, live: list[Sequence]) -> None:
        """Refcounts equal the number of live tables holding each block; the free list
        is exactly the unreferenced blocks. Used by tests after random workloads."""
        refs = [0] * self.num_blocks
        for seq in live:
            for bid in seq.block_table:
                refs[bid] += 1
        for block in self.blocks:
            assert block.ref_count == refs[block.block_id], (block, refs[block.block_id])
            assert (block.ref_count == 0) == (block.block_id in self.free), block
        for h, bid in self.cached.items():
            assert self.blocks[bid].hash == h
