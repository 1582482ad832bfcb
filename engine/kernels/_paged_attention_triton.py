"""Triton kernel behind paged_decode_attention_triton. Imported only when a Triton path runs.

One program per (sequence, kv head). It loads each K/V block once and scores it against all
`group` query heads that share the kv head (GQA), keeping a running max / sum per query head
(online softmax), so the whole context never has to sit in registers at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_NO_WINDOW = 2**31 - 1  # "window" wider than any context: no sliding window


@triton.jit
def _paged_decode_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    scale, window,
    stride_q_b, stride_q_h, stride_q_d,
    stride_o_b, stride_o_h, stride_o_d,
    stride_k_block, stride_k_slot, stride_k_head, stride_k_d,
    stride_v_block, stride_v_slot, stride_v_head, stride_v_d,
    stride_bt_b,
    GROUP: tl.constexpr, GROUP_P2: tl.constexpr,  # query heads per kv head (and pow2 pad)
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P2: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    ctx = tl.load(context_lens_ptr + seq)

    offs_g = tl.arange(0, GROUP_P2)
    offs_d = tl.arange(0, HEAD_DIM_P2)
    offs_t = tl.arange(0, BLOCK_SIZE)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_g  # the query heads served by this kv head

    # Queries of the whole group, pre-scaled, fp32: [GROUP_P2, HEAD_DIM_P2]. Padded rows are 0.
    q_offs = seq * stride_q_b + heads[:, None] * stride_q_h + offs_d[None, :] * stride_q_d
    q = tl.load(q_ptr + q_offs, mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    q = q.to(tl.float32) * scale

    # The query sits at position ctx-1 and sees keys [start, ctx). Blocks before start are skipped.
    start = tl.maximum(ctx - window, 0)
    first_block = start // BLOCK_SIZE
    last_block = (ctx + BLOCK_SIZE - 1) // BLOCK_SIZE

    m = tl.full([GROUP_P2], float("-inf"), tl.float32)  # running max per query head
    l = tl.zeros([GROUP_P2], tl.float32)  # running softmax denominator
    acc = tl.zeros([GROUP_P2, HEAD_DIM_P2], tl.float32)  # running numerator . V

    for logical_block in range(first_block, last_block):
        # int64: block_id * stride_k_block overflows int32 on large caches.
        block_id = tl.load(block_tables_ptr + seq * stride_bt_b + logical_block).to(tl.int64)
        pos = logical_block * BLOCK_SIZE + offs_t
        t_mask = (pos >= start) & (pos < ctx)  # partial last block and window start
        kv_mask = t_mask[:, None] & d_mask[None, :]

        k_offs = (block_id * stride_k_block + offs_t[:, None] * stride_k_slot
                  + kv_head * stride_k_head + offs_d[None, :] * stride_k_d)
        k = tl.load(k_cache_ptr + k_offs, mask=kv_mask, other=0.0).to(tl.float32)  # [BS, D]

        # Scores [GROUP_P2, BS] by broadcast-multiply-reduce: tl.dot needs >= 16 rows and
        # a decode step has only GROUP query rows per program.
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
        s = tl.where(t_mask[None, :], s, float("-inf"))

        # Every visited block holds >= 1 visible key, so m_new is finite after the first block.
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)  # rescales what was accumulated under the old max
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)

        v_offs = (block_id * stride_v_block + offs_t[:, None] * stride_v_slot
                  + kv_head * stride_v_head + offs_d[None, :] * stride_v_d)
        v = tl.load(v_cache_ptr + v_offs, mask=kv_mask, other=0.0).to(tl.float32)  # [BS, D]
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new

    l = tl.where(l > 0, l, 1.0)  # ctx == 0: output zeros instead of 0/0
    out = acc / l[:, None]
    o_offs = seq * stride_o_b + heads[:, None] * stride_o_h + offs_d[None, :] * stride_o_d
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])


def launch_paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, kv_head_dim = k_cache.shape
    assert v_cache.shape == k_cache.shape, (v_cache.shape, k_cache.shape)
    assert kv_head_dim == head_dim, f"q head_dim {head_dim} != cache head_dim {kv_head_dim}"
    assert num_heads % num_kv_heads == 0, f"num_heads {num_heads} not a multiple of {num_kv_heads}"
    assert block_size & (block_size - 1) == 0, f"block_size must be a power of two, got {block_size}"
    assert block_tables.dim() == 2 and block_tables.shape[0] == batch
    assert context_lens.shape == (batch,)
    if sliding_window is not None:
        assert sliding_window >= 1, f"sliding_window must be >= 1, got {sliding_window}"
    group = num_heads // num_kv_heads

    out = torch.empty_like(q)
    if batch == 0:
        return out
    block_tables = block_tables.contiguous()  # the kernel steps along a row with stride 1
    _paged_decode_kernel[(batch, num_kv_heads)](
        out, q, k_cache, v_cache, block_tables, context_lens.contiguous(),
        float(scale), min(sliding_window, _NO_WINDOW) if sliding_window is not None else _NO_WINDOW,
        *q.stride(), *out.stride(), *k_cache.stride(), *v_cache.stride(),
        block_tables.stride(0),
        GROUP=group, GROUP_P2=triton.next_power_of_2(group),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim, HEAD_DIM_P2=triton.next_power_of_2(head_dim),
    )
    return out
