"""Triton kernel behind store_kv_triton. Imported only when a Triton path runs."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_key_n, stride_value_n,  # token stride of key / value
    stride_kc_block, stride_kc_slot,  # block / in-block stride of k_cache
    stride_vc_block, stride_vc_slot,
    BLOCK_SIZE: tl.constexpr,
    ROW: tl.constexpr,  # num_kv_heads * head_dim: one token's K (or V), contiguous
    ROW_P2: tl.constexpr,  # ROW rounded up to a power of two (tl.arange needs one)
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)  # int64: block * stride can pass 2**31
    if slot < 0:  # padding token
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    cols = tl.arange(0, ROW_P2)
    mask = cols < ROW

    k = tl.load(key_ptr + token * stride_key_n + cols, mask=mask)
    v = tl.load(value_ptr + token * stride_value_n + cols, mask=mask)
    k_dst = k_cache_ptr + block * stride_kc_block + offset * stride_kc_slot + cols
    v_dst = v_cache_ptr + block * stride_vc_block + offset * stride_vc_slot + cols
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _rows_contiguous(t: torch.Tensor) -> bool:
    """The last two dims [num_kv_heads, head_dim] are one dense row."""
    return t.stride(-1) == 1 and t.stride(-2) == t.shape[-1]


def launch_store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    num_tokens, num_kv_heads, head_dim = key.shape
    assert value.shape == key.shape, (value.shape, key.shape)
    assert k_cache.shape == v_cache.shape and k_cache.shape[2:] == key.shape[1:], (
        f"cache {tuple(k_cache.shape)} does not match key {tuple(key.shape)}"
    )
    assert slot_mapping.shape == (num_tokens,), (slot_mapping.shape, num_tokens)
    # Inputs may be strided views (e.g. split from a fused qkv); only the row must be dense.
    if not _rows_contiguous(key):
        key = key.contiguous()
    if not _rows_contiguous(value):
        value = value.contiguous()
    # The cache is written in place, so it cannot be copied to fix its layout.
    assert _rows_contiguous(k_cache) and _rows_contiguous(v_cache), (
        "k_cache/v_cache need contiguous [num_kv_heads, head_dim] per slot"
    )
    if num_tokens == 0:
        return
    row = num_kv_heads * head_dim
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping.contiguous(),
        key.stride(0), value.stride(0),
        k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1),
        BLOCK_SIZE=k_cache.shape[1],
        ROW=row,
        ROW_P2=triton.next_power_of_2(row),
    )
