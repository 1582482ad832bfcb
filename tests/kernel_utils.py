"""A paged KV batch built the slow obvious way, and a dense attention oracle: what the
kernel tests (tests/engine/kernels/) check the paged kernels against."""
from __future__ import annotations

import torch


def make_paged_batch(
    context_lens: list[int],
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    spare_blocks: int = 3,
    table_pad: int = -1,
):
    """Random dense K/V per sequence, scattered into shuffled cache blocks.

    Every cache slot not holding a real key is NaN, so a kernel that reads a slot it
    should not (past the context, a padding block) poisons its output.
    """
    g = torch.Generator().manual_seed(seed)
    batch = len(context_lens)
    blocks_per_seq = [-(-c // block_size) for c in context_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    max_blocks = max(blocks_per_seq) + 2  # + padding columns
    perm = torch.randperm(num_blocks, generator=g)  # non-contiguous, shuffled block ids

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    block_tables = torch.full((batch, max_blocks), table_pad, dtype=torch.int32)
    dense_k, dense_v = [], []
    next_block = 0
    for b, ctx in enumerate(context_lens):
        k = torch.randn(ctx, num_kv_heads, head_dim, generator=g).to(dtype)
        v = torch.randn(ctx, num_kv_heads, head_dim, generator=g).to(dtype)
        dense_k.append(k)
        dense_v.append(v)
        ids = perm[next_block : next_block + blocks_per_seq[b]]
        next_block += blocks_per_seq[b]
        block_tables[b, : len(ids)] = ids.to(torch.int32)
        for t in range(ctx):  # the slow obvious way: no shared code with store_kv
            k_cache[ids[t // block_size], t % block_size] = k[t]
            v_cache[ids[t // block_size], t % block_size] = v[t]
    q = torch.randn(batch, num_kv_heads * group, head_dim, generator=g).to(dtype)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return q, k_cache, v_cache, block_tables, lens, dense_k, dense_v


def naive_dense_attention(q, dense_k, dense_v, scale, sliding_window=None):
    """Independent oracle: SDPA over unpaged K/V with an explicit position mask."""
    out = torch.empty_like(q)
    num_heads = q.shape[1]
    for b, (k, v) in enumerate(zip(dense_k, dense_v)):
        ctx, num_kv_heads, _ = k.shape
        p = ctx - 1  # the query's position
        pos = torch.arange(ctx)
        visible = pos <= p
        if sliding_window is not None:
            visible &= pos > p - sliding_window
        o = torch.nn.functional.scaled_dot_product_attention(
            q[b].float()[:, None, :],  # [H, 1, D]
            k.float().transpose(0, 1),  # [Hkv, T, D]
            v.float().transpose(0, 1),
            attn_mask=visible[None, None, :],
            scale=scale,
            enable_gqa=num_heads != num_kv_heads,
        )
        out[b] = o[:, 0, :].to(q.dtype)
    return out
