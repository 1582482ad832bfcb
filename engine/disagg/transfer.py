"""A request's KV pages from one pool to another on torch.distributed's send/recv.

The pool is [K/V, layer, block, slot, kv head, head dim] (MLA: one latent, [1, layer, ...]):
a request's blocks are gathered along the block axis into one contiguous tensor
[K/V, layer, n, slot, kv head, head dim] (every layer, its blocks only; a partial last
block travels whole), sent in one message, and scattered into the decode side's own blocks.
gloo on the CPU; NCCL on CUDA (written, untested here: this machine has no two GPUs).
"""
from __future__ import annotations

import time

import torch

from engine.parallel.comm import Comm


def pages_shape(kv: torch.Tensor, num_blocks: int) -> tuple[int, ...]:
    """[K/V, layer, num_blocks, slot, kv head, head dim]: what one request's pages occupy."""
    return (kv.shape[0], kv.shape[1], num_blocks, *kv.shape[3:])


def gather(kv: torch.Tensor, blocks: list[int]) -> torch.Tensor:
    idx = torch.tensor(blocks, dtype=torch.long, device=kv.device)
    return kv.index_select(2, idx).contiguous()


def scatter(kv: torch.Tensor, blocks: list[int], pages: torch.Tensor) -> None:
    idx = torch.tensor(blocks, dtype=torch.long, device=kv.device)
    kv.index_copy_(2, idx, pages)


def send(comm: Comm, kv: torch.Tensor, blocks: list[int], dst: int, tag: int) -> tuple[int, float, float]:
    """Send blocks' pages to rank dst (blocking until they left). -> (bytes, start, ms)."""
    pages = gather(kv, blocks)
    start = time.perf_counter()
    comm.group.send([pages], dst, tag).wait()
    if pages.is_cuda:
        torch.cuda.synchronize(pages.device)
    return pages.numel() * pages.element_size(), start, (time.perf_counter() - start) * 1e3


def post_recv(comm: Comm, kv: torch.Tensor, num_blocks: int, src: int, tag: int):
    """A posted receive of num_blocks blocks' pages from src: (the staging tensor, its Work).
    The decode side posts it before asking for the pages, so the send never waits on it."""
    pages = torch.empty(pages_shape(kv, num_blocks), dtype=kv.dtype, device=kv.device)
    return pages, comm.group.recv([pages], src, tag)


def backend(kv: torch.Tensor) -> str:
    return "nccl" if kv.is_cuda else "gloo"
