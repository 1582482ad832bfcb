"""Who holds which KV block, kept from one kv.pool look to the next (engine/trace/kv_pool.py),
so that a step reads the blocks it can have changed, not every live table: each sequence's
blocks whose fill moved (its computed tokens), those its table gained or lost, and those of
sequences that joined or left. Reading every block of every live table each step cost
O(context x batch): 60 blocks a sequence at 950 tokens, ~5% of a step on the embedded MoE
at batch 1 and 8 (2026-12-06)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from engine.sequence import Sequence


_NONE: tuple[list[int], int] = ([], 0)  # a sequence the last look did not see


@dataclass
class Holders:
    block_size: int
    tables: dict[str, tuple[list[int], int]] = field(default_factory=dict)  # request -> (its table, computed tokens)
    at: dict[int, dict[str, int]] = field(default_factory=dict)  # block -> {holder: the block's index in its table}

    def reset(self, live: Iterable[Sequence]) -> None:
        """Read every live table (a full look)."""
        self.tables, self.at = {}, {}
        self.update(live)

    def update(self, live: Iterable[Sequence]) -> set[int]:
        """Bring the map up to the live tables now -> the blocks whose holders or fill may differ
        from the last look's."""
        bs, changed, now = self.block_size, set(), {}
        for seq in live:
            rid, table, n = seq.request_id, seq.block_table, seq.num_computed_tokens
            old, old_n = self.tables.get(rid, _NONE)
            if table == old:  # most steps: the same blocks, their snapshot kept
                snapshot = old
            else:
                snapshot, k = list(table), min(len(old), len(table))
                same = k if table[:k] == old[:k] else next(i for i in range(k) if table[i] != old[i])
                for i in range(same, len(old)):  # blocks the table no longer holds where it held them
                    self._drop(old[i], rid)
                    changed.add(old[i])
                for i in range(same, len(table)):
                    self.at.setdefault(table[i], {})[rid] = i
                    changed.add(table[i])
            lo, hi = min(old_n, n), max(old_n, n)  # the blocks whose written slots moved
            changed.update(table[lo // bs:min(len(table), hi // bs + 1)])
            now[rid] = (snapshot, n)
        for rid, (old, _) in self.tables.items():
            if rid not in now:  # finished, preempted: it holds none of them now
                for b in old:
                    self._drop(b, rid)
                changed.update(old)
        self.tables = now
        return changed

    def owners(self, block: int) -> tuple[str, ...]:
        return tuple(sorted(self.at.get(block, ())))

    def fill(self, block: int) -> int:
        """The token slots its holders have written (the most any of them has)."""
        bs = self.block_size
        return max((min(bs, max(0, self.tables[rid][1] - i * bs)) for rid, i in self.at.get(block, {}).items()),
                   default=0)

    def _drop(self, block: int, rid: str) -> None:
        holders = self.at.get(block)
        if holders is not None and holders.get(rid) is not None:
            del holders[rid]
            if not holders:
                del self.at[block]
