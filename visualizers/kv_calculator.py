"""KV-cache size for reference models (published configs) at any context length and dtype.

Standard attention stores K and V for every layer and KV head:
    bytes = 2 x layers x kv_heads x head_dim x tokens x bytes_per_value
Multi-head latent attention (DeepSeek-V3) stores one compressed latent (plus a small
decoupled RoPE key) per token per layer instead.
"""
from __future__ import annotations

from dataclasses import dataclass

from visualizers._html import esc, fmt_bytes, table

DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int4": 0.5}


@dataclass(frozen=True)
class RefModel:
    name: str
    layers: int
    kv_heads: int = 0
    head_dim: int = 0
    latent_dim: int = 0  # MLA: kv_lora_rank + qk_rope_head_dim values per token per layer
    heads: int = 0  # MLA: query heads, for the "without compression" comparison
    k_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def values_per_token(self) -> int:
        if self.latent_dim:
            return self.layers * self.latent_dim
        return 2 * self.layers * self.kv_heads * self.head_dim


REFERENCE_MODELS = {
    m.name: m for m in (
        RefModel("Llama-3-8B", layers=32, kv_heads=8, head_dim=128),
        RefModel("Llama-3-70B", layers=80, kv_heads=8, head_dim=128),
        RefModel("Mixtral-8x7B", layers=32, kv_heads=8, head_dim=128),
        # kv_lora_rank 512 + qk_rope_head_dim 64; 128 heads with K 192 (128+64) and V 128 dims
        RefModel("DeepSeek-V3", layers=61, latent_dim=512 + 64, heads=128, k_head_dim=192, v_head_dim=128),
    )
}


def kv_cache_bytes(model: RefModel, tokens: int, dtype: str) -> float:
    return model.values_per_token * tokens * DTYPE_BYTES[dtype]


def formula(model: RefModel, tokens: int, dtype: str) -> str:
    b = DTYPE_BYTES[dtype]
    if model.latent_dim:
        return (f"{model.layers} layers × {model.latent_dim} latent values (512 + 64 RoPE) × "
                f"{tokens:,} tokens × {b:g} B")
    return f"2 × {model.layers} layers × {model.kv_heads} KV heads × {model.head_dim} dims × {tokens:,} tokens × {b:g} B"


def calculator_html(tokens: int, dtype: str, names: list[str] | None = None) -> str:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}")
    tokens = max(0, int(tokens))
    rows = []
    for name in names or list(REFERENCE_MODELS):
        m = REFERENCE_MODELS[name]
        size = kv_cache_bytes(m, tokens, dtype)
        note = ""
        if m.latent_dim:
            full = m.layers * m.heads * (m.k_head_dim + m.v_head_dim) * tokens * DTYPE_BYTES[dtype]
            note = f"without the latent: {fmt_bytes(full)} ({full / max(size, 1):.0f}× more)"
        rows.append([esc(name), esc(formula(m, tokens, dtype)) + (f"<br><i>{esc(note)}</i>" if note else ""),
                     f"<b>{size:,.0f} B</b><br>= {esc(fmt_bytes(size))}<br>({size / 1e6:,.1f} MB)"])
    return table(["model", "formula", "size"], rows, "tt-table tt-calc")
