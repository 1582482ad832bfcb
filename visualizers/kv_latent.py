"""The KV panel's formula for a model with multi-head latent attention (DeepSeek V2 / V3):
the pool keeps one latent a token a layer (kv_lora_rank + qk_rope_head_dim numbers), not K
and V, so its size is layers x latent x bytes. The bytes per token are the pool's own count
(describe().kv_pool, in the model facts); the calculator's formula for the same shape is
shown to agree, and full K and V of every head beside it: what the latent saves."""
from __future__ import annotations

from visualizers._html import esc, fmt_bytes
from visualizers.kv_calculator import RefModel


def latent_formula_html(model: dict, tokens: int, who: str = "this request") -> str:
    """model: the page's model facts with "mla" and the pool's kv_* counts."""
    mla, L, b = model["mla"], model["num_layers"], model["dtype_bytes"]
    rank, rope = int(mla["kv_lora_rank"]), int(mla["qk_rope_head_dim"])
    qk, v, H = int(mla["qk_nope_head_dim"]) + rope, int(mla["v_head_dim"]), model["num_heads"]
    ref = RefModel("this model", layers=L, latent_dim=rank + rope, heads=H, k_head_dim=qk, v_head_dim=v)
    per_token = int(model.get("kv_bytes_per_token") or 0)  # measured: the pool's bytes a token
    calc = ref.values_per_token * b
    agree = ("the calculator's formula gives the same" if per_token == calc else
             f"the calculator's formula gives {calc:,} B: they differ")
    full = L * H * (qk + v) * b
    capacity = model["num_blocks"] * model["block_size"]
    return (f"<div class='tt-formula'>KV bytes = layers × (kv_lora_rank + qk_rope_head_dim) × tokens × "
            f"bytes_per_value (multi-head latent attention: one latent a token a layer, no K and V)"
            f"<br>this model: {L} × ({rank} + {rope}) × tokens × {b} B ({esc(model['dtype'])}) = "
            f"<b>{per_token:,} B per token</b>, the pool's own count ({esc(agree)})"
            f"<br>latent: {rank + rope:,} numbers a token a layer (1/{full / max(per_token, 1):.0f} of full K and V: "
            f"{full:,} B a token for {H} heads × ({qk} + {v}) dims)"
            f"<br>{esc(who)}: {per_token:,} B × {tokens:,} tokens = <b>{esc(fmt_bytes(per_token * tokens))}</b>"
            f"<br>pool: {model['num_blocks']:,} blocks × {model['block_size']} tokens = {capacity:,} tokens × "
            f"{per_token:,} B = <b>{esc(fmt_bytes(model['kv_cache_bytes']))}</b> allocated</div>")
