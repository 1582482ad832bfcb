"""Kernels for the two hot paths of the paged KV cache.

Each op has a plain-torch reference (used on CPU, and the oracle in tests) and a
Triton kernel (used on CUDA). Triton is imported lazily, only when a Triton path
actually runs, so `import engine.kernels` is cheap and works without triton.
"""

from ._dispatch import triton_available
from .kv_store import store_kv, store_kv_reference, store_kv_triton
from .paged_attention import (
    paged_decode_attention,
    paged_decode_attention_reference,
    paged_decode_attention_triton,
)

__all__ = [
    "triton_available",
    "store_kv",
    "store_kv_reference",
    "store_kv_triton",
    "paged_decode_attention",
    "paged_decode_attention_reference",
    "paged_decode_attention_triton",
]
