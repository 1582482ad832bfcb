"""CUDA: the Triton kernels (paged decode attention, the KV store) against the torch path."""
from __future__ import annotations

import torch

from benchmarks.bench.context import Bench
from benchmarks.bench.timing import median_time, synchronize
from engine.kernels import paged_decode_attention, store_kv
from engine.layers.attention import decode_attention


def gpu(b: Bench) -> None:
    """CUDA only: the Triton kernels against the torch path."""
    if b.cuda:
        kernels(b)


def kernels(b: Bench, dtype: torch.dtype = torch.bfloat16, shape: tuple[int, ...] = (8, 32, 8, 128, 16, 2048),
            repeats: int = 20) -> None:
    """Triton against the torch path. shape: batch, heads, kv heads, head dim, block size, context."""
    dev, dt = b.device, dtype
    batch, h, kvh, d, bs, ctx = shape
    nblocks = batch * ctx // bs
    k_cache = torch.randn(nblocks, bs, kvh, d, device=dev, dtype=dt)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(nblocks, device=dev).view(batch, -1)
    lens = torch.full((batch,), ctx, device=dev, dtype=torch.int32)
    q = torch.randn(batch, h, d, device=dev, dtype=dt)

    def timed(fn):
        fn()
        synchronize(dev)
        return median_time(lambda: (fn(), synchronize(dev)), repeats) * 1e6
    t_tri = timed(lambda: paged_decode_attention(q, k_cache, v_cache, tables, lens, d ** -0.5, use_triton=True))
    t_torch = timed(lambda: decode_attention(q, k_cache, v_cache, tables, lens, d ** -0.5, None))
    b.add("gpu", f"paged decode attention, Triton (B={batch}, ctx={ctx})", 1e6 / t_tri, "calls/s", 1e6 / t_torch,
          f"baseline: the torch path (gather + SDPA); {t_tri:.0f} us vs {t_torch:.0f} us")
    n_new = min(batch * 64, nblocks * bs)  # a chunk of prefill: 64 tokens per sequence
    new_k = torch.randn(n_new, kvh, d, device=dev, dtype=dt)
    slots = torch.randperm(nblocks * bs, device=dev)[:n_new]
    t_tri = timed(lambda: store_kv(new_k, new_k, k_cache, v_cache, slots, use_triton=True))
    t_torch = timed(lambda: (k_cache.view(-1, kvh, d).index_copy_(0, slots, new_k),
                             v_cache.view(-1, kvh, d).index_copy_(0, slots, new_k)))
    b.add("gpu", f"KV store, Triton ({n_new} tokens)", 1e6 / t_tri, "calls/s", 1e6 / t_torch,
          f"baseline: the torch path (index_copy_); {t_tri:.0f} us vs {t_torch:.0f} us")
