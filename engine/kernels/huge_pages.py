"""CPU tensors on 2 MB pages (transparent huge pages), for what a decode step streams: the
blocked weights and the KV pool (engine/kernels/cpu.py huge_page_empty).

Why: a decode step streams every weight once and reads KV pages scattered over the pool. With
4 KB pages that is a TLB miss every 4 KB and a hardware prefetcher that stops at each page's
end; with 2 MB pages almost none. Linux's default THP mode, 'madvise', gives them only to memory
that asks before it is first written, and only in whole 2 MB pages of a mapping: a tensor
under 2 MB in a mapping of its own never gets one. At bfloat16 three of SmolLM2's four
matrices a layer are under 2 MB (qkv 1.1 MB, o 0.66, down 1.8: 40% of a step's bytes), so
tensors that small are packed one after another into shared chunks (Arena) that ask for huge
pages as a whole. Best effort: where the system says no, the pages are ordinary ones.
"""
from __future__ import annotations

import math
import mmap
import threading

import torch

HUGE_PAGE = 2 << 20
CHUNK = 16 << 20  # an arena chunk: address space; only the 2 MB pages written become resident
ALIGN = 4096  # each packed tensor starts on a page of its own (its stream's first line too)


def fresh(nbytes: int) -> torch.Tensor:
    """nbytes of uninitialised memory (uint8) starting on a 2 MB boundary, in an anonymous
    mapping of its own marked for huge pages: not the allocator's, since memory a process
    reuses was written before and keeps its small pages. Unmapped when its storage is freed."""
    # private: a shared anonymous mapping is shmem, whose huge pages are a separate setting
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # + room to align
    raw = torch.frombuffer(region, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    region.madvise(mmap.MADV_HUGEPAGE, start, nbytes)
    return raw[start:start + nbytes]


class Arena:
    """Tensors under 2 MB packed into shared huge-page chunks, each from a fresh page of its
    chunk. A chunk's memory is freed when the last tensor in it (and the arena, for the chunk it
    is filling) lets go of it."""

    def __init__(self, chunk: int = CHUNK):
        self.chunk_bytes = chunk
        self.chunk: torch.Tensor | None = None
        self.used = 0
        self.lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        size = -(-nbytes // ALIGN) * ALIGN
        with self.lock:
            if self.chunk is None or self.used + size > self.chunk_bytes:
                self.chunk, self.used = fresh(self.chunk_bytes), 0
            out = self.chunk[self.used:self.used + nbytes]
            self.used += size
        return out


ARENA = Arena()


def empty(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised CPU tensor on memory that asks for 2 MB pages: a mapping of its own
    from 2 MB up, a place in the shared arena below."""
    nbytes = math.prod(shape) * dtype.itemsize
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(shape, dtype=dtype)
    raw = fresh(nbytes) if nbytes >= HUGE_PAGE else ARENA.take(max(nbytes, 1))[:nbytes]
    return raw.view(dtype).view(shape)


def zeros(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`empty`'s memory is never written before (a fresh anonymous mapping, or an arena slot
    taken once), and Linux hands such pages out zeroed on their first touch: so zeros without
    a write, and a page becomes resident only when it is used (a 1 GiB KV pool took 1.5 s to
    zero here, and all of it stayed resident from the start)."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.zeros(shape, dtype=dtype)
    return empty(shape, dtype)
