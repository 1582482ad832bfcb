"""KV-cache size for reference models (published configs) at any context length and dtype.

Standard attention stores K and V for every layer and KV head:
    bytes = 2 x layers x kv_heads x head_dim x tokens x bytes_per_value
Multi-head latent attention (DeepSeek-V3) stores one compressed latent (plus a small
decoupled RoPE key) per token per layer instead.
"""
from __future__ import annotations

from dataclasses import dataclass

from visualizers._html import esc, table
from visualizers.i18n import gettext, number, size

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


def formula(model: RefModel, tokens: int, dtype: str, lang: str = "en") -> str:
    b = DTYPE_BYTES[dtype]
    if model.latent_dim:
        return gettext(lang, "{layers} layers × {latent} latent values (512 + 64 RoPE) × {tokens} tokens × {bytes} B",
                       layers=model.layers, latent=model.latent_dim, tokens=number(lang, tokens), bytes=f"{b:g}")
    return gettext(lang, "2 × {layers} layers × {kv_heads} KV heads × {dims} dims × {tokens} tokens × {bytes} B",
                   layers=model.layers, kv_heads=model.kv_heads, dims=model.head_dim, tokens=number(lang, tokens),
                   bytes=f"{b:g}")


def calculator_html(tokens: int, dtype: str, names: list[str] | None = None, lang: str = "en") -> str:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}")
    tokens = max(0, int(tokens))
    rows = []
    for name in names or list(REFERENCE_MODELS):
        m = REFERENCE_MODELS[name]
        total = kv_cache_bytes(m, tokens, dtype)
        note = ""
        if m.latent_dim:
            full = m.layers * m.heads * (m.k_head_dim + m.v_head_dim) * tokens * DTYPE_BYTES[dtype]
            note = gettext(lang, "without the latent: {size} ({times}× more)", size=size(lang, full),
                           times=number(lang, full / max(total, 1)))
        rows.append([esc(name), esc(formula(m, tokens, dtype, lang)) + (f"<br><i>{esc(note)}</i>" if note else ""),
                     f"<b>{number(lang, total)} B</b><br>= {esc(size(lang, total))}<br>({number(lang, total / 1e6, 1)} MB)"])
    return table([gettext(lang, "model"), gettext(lang, "formula"), gettext(lang, "size")], rows, "tt-table tt-calc")
