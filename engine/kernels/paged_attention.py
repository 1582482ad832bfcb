"""Decode attention over the paged KV cache: one new query token per sequence.

q: [B, num_heads, head_dim]; k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim];
block_tables: int32 [B, max_blocks_per_seq] (entries past the used blocks are padding, never read);
context_lens: int32 [B], keys per sequence including the new token (already in the cache).
GQA: query head h reads kv head h // (num_heads // num_kv_heads).
sliding_window w (Mistral / HF semantics): the query attends only its last w keys, itself included.
"""

from __future__ import annotations

import torch

from ._dispatch import use_triton_for


def paged_decode_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Plain-torch oracle: gather each sequence's keys from its blocks, then dense softmax in fp32."""
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    out = torch.zeros_like(q)
    for b in range(batch):
        ctx = int(context_lens[b])
        if ctx <= 0:
            continue  # nothing to attend to: output zeros
        num_blocks = -(-ctx // block_size)
        blocks = block_tables[b, :num_blocks].long()
        k = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx]
        v = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx]
        if sliding_window is not None:
            start = max(0, ctx - sliding_window)
            k, v = k[start:], v[start:]
        # [T, kv_heads, D] -> [T, heads, D]: each kv head serves `group` consecutive query heads.
        k = k.float().repeat_interleave(group, dim=1)
        v = v.float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", q[b].float(), k) * scale
        probs = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("ht,thd->hd", probs, v).to(q.dtype)
    return out


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Triton kernel: one program per (sequence, kv head), online softmax over the blocks."""
    from ._paged_attention_triton import launch_paged_decode  # lazy: importing triton is not free

    return launch_paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale, sliding_window)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """Triton on CUDA (or on CPU with use_triton=True under TRITON_INTERPRET=1), else reference."""
    fn = paged_decode_attention_triton if use_triton_for(q, use_triton) else paged_decode_attention_reference
    return fn(q, k_cache, v_cache, block_tables, context_lens, scale, sliding_window)
