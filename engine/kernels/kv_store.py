"""Write new tokens' K/V into the paged cache.

Cache layout (per layer): k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim].
A token's slot = block_id * block_size + offset_in_block; slot -1 = padding, skipped.
"""

from __future__ import annotations

import torch

from ._dispatch import use_triton_for


def store_kv_reference(
    key: torch.Tensor,  # [N, num_kv_heads, head_dim]
    value: torch.Tensor,  # [N, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [N] int32/int64, -1 = skip
) -> None:
    """Plain-torch store, in place."""
    block_size = k_cache.shape[1]
    slots = slot_mapping.to(torch.long)
    keep = slots >= 0
    slots = slots[keep]
    # Index by (block, offset) rather than viewing the cache flat: works for any cache strides.
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = key[keep].to(k_cache.dtype)
    v_cache[blocks, offsets] = value[keep].to(v_cache.dtype)


def store_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Triton store, in place: one program per token."""
    from ._kv_store_triton import launch_store_kv  # lazy: importing triton is not free

    launch_store_kv(key, value, k_cache, v_cache, slot_mapping)


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    use_triton: bool | None = None,
) -> None:
    """Triton on CUDA (or on CPU with use_triton=True under TRITON_INTERPRET=1), else reference."""
    if use_triton_for(key, use_triton):
        store_kv_triton(key, value, k_cache, v_cache, slot_mapping)
    else:
        store_kv_reference(key, value, k_cache, v_cache, slot_mapping)
