"""A `full` trace's attention probabilities from the paged KV pool, read in place
(cpu_probs.c): what engine/trace/capture.py's attention_probs computes from a gathered copy
of a sequence's keys, without the copy (layers x context x KV heads x head dim floats a
step) and in one call for every captured layer."""
from __future__ import annotations

import ctypes
import functools

import torch

from engine.kernels import cpu

_P, _L = ctypes.c_void_p, ctypes.c_long


@functools.cache
def _kernel(lib: ctypes.CDLL):
    fn = lib.tt_attention_probs
    fn.argtypes = [_P, _L, _L, _L, _P, _L, _P, _P, _L, _L, _L, _L, _L, _L, ctypes.c_float, _P, _L, _L, _P,
                   ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def applies(q: torch.Tensor, k_pool: torch.Tensor) -> bool:
    """Whether the kernel takes these: float32 CPU queries [L, rows, H, D] whose heads are
    contiguous, and a float32 CPU pool of keys [layer, block, slot, KVH, D] contiguous below
    its layer dimension."""
    if q.dtype != torch.float32 or k_pool.dtype != torch.float32 or q.device.type != "cpu" \
            or k_pool.device.type != "cpu" or cpu.library() is None:
        return False
    D = q.shape[3]
    _, _, bs, kvh, d = k_pool.shape
    return q.stride(3) == 1 and q.stride(2) == D and d == D and k_pool.stride()[1:] == (bs * kvh * D, kvh * D, D, 1)


def attention_probs_paged(q: torch.Tensor, k_pool: torch.Tensor, layers: list[int], table: torch.Tensor, ctx: int,
                          scale: float, windows: list[int | None], k_head: int, k_start: int) -> torch.Tensor:
    """q [L, rows, H, D]: the queries at the last `rows` positions of a context of `ctx` keys
    in the pool's layers `layers`; table: the sequence's block ids (int64, >= its ctx keys'
    blocks). -> float32 [L, H, rows, k_head + ctx - k_start]: each head's softmax over the
    keys its row sees (causal, each layer's sliding window), keys 0 .. k_head - 1 and k_start
    on (capture.keep_keys of capture.attention_probs)."""
    L, rows, H, D = q.shape
    _, _, bs, kvh, _ = k_pool.shape
    out = torch.empty(L, H, rows, k_head + ctx - k_start)
    ids = torch.tensor(layers, dtype=torch.long)
    wins = torch.tensor([w or 0 for w in windows], dtype=torch.long)
    table = table.to(torch.long).contiguous()
    rc = _kernel(cpu.library())(q.data_ptr(), L, q.stride(0), q.stride(1), k_pool.data_ptr(), k_pool.stride(0),
                                ids.data_ptr(), table.data_ptr(), ctx, rows, H, kvh, D, bs, scale, wins.data_ptr(),
                                k_head, k_start, out.data_ptr(), torch.get_num_threads())
    if rc:
        raise MemoryError(f"cpu_probs: no memory for the scores of {ctx} keys")
    return out
