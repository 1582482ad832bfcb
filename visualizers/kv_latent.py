"""The KV panel's formula for a model with multi-head latent attention (DeepSeek V2 / V3):
the pool keeps one latent a token a layer (kv_lora_rank + qk_rope_head_dim numbers), not K
and V, so its size is layers x latent x bytes. The bytes per token are the pool's own count
(describe().kv_pool, in the model facts); the calculator's formula for the same shape is
shown to agree, and full K and V of every head beside it: what the latent saves."""
from __future__ import annotations

from visualizers import i18n
from visualizers._html import bold, esc, fmt_bytes, said_html
from visualizers.kv_calculator import RefModel

THIS_REQUEST = i18n.N_("this request")


def latent_formula_html(model: dict, tokens: int, who: str = THIS_REQUEST, lang: str = i18n.DEFAULT) -> str:
    """model: the page's model facts with "mla" and the pool's kv_* counts; who: whose tokens, in
    English (shown in lang)."""
    mla, L, b = model["mla"], model["num_layers"], model["dtype_bytes"]
    rank, rope = int(mla["kv_lora_rank"]), int(mla["qk_rope_head_dim"])
    qk, v, H = int(mla["qk_nope_head_dim"]) + rope, int(mla["v_head_dim"]), model["num_heads"]
    ref = RefModel("this model", layers=L, latent_dim=rank + rope, heads=H, k_head_dim=qk, v_head_dim=v)
    per_token = int(model.get("kv_bytes_per_token") or 0)  # measured: the pool's bytes a token
    calc = ref.values_per_token * b
    num = lambda x: i18n.number(lang, x)  # noqa: E731
    agree = (i18n.gettext(lang, "the calculator's formula gives the same") if per_token == calc else
             i18n.gettext(lang, "the calculator's formula gives {bytes} B: they differ", bytes=num(calc)))
    full = L * H * (qk + v) * b
    capacity = model["num_blocks"] * model["block_size"]
    per_line = said_html(lang, "{per} B per token", per=num(per_token))
    lines = [
        said_html(lang, "KV bytes = layers × (kv_lora_rank + qk_rope_head_dim) × tokens × bytes_per_value (multi-head "
                        "latent attention: one latent a token a layer, no K and V)"),
        said_html(lang, "this model: {layers} × ({rank} + {rope}) × tokens × {b} B ({dtype}) = {per_token}, the pool's "
                        "own count ({agree})", layers=str(L), rank=str(rank), rope=str(rope), b=str(b),
                  dtype=esc(model['dtype']), per_token=bold(per_line), agree=esc(agree)),
        said_html(lang, "latent: {n} numbers a token a layer (1/{times} of full K and V: {full} B a token for {heads} "
                        "heads × ({qk} + {v}) dims)", n=num(rank + rope), times=format(full / max(per_token, 1), ".0f"),
                  full=num(full), heads=str(H), qk=str(qk), v=str(v)),
        said_html(lang, "{who}: {per} B × {tokens} tokens = {bytes}", who=esc(i18n.gettext(lang, who)),
                  per=num(per_token), tokens=num(tokens), bytes=bold(esc(fmt_bytes(per_token * tokens)))),
        said_html(lang, "pool: {blocks} blocks × {size} tokens = {capacity} tokens × {per} B = {bytes} allocated",
                  blocks=num(model['num_blocks']), size=str(model['block_size']), capacity=num(capacity),
                  per=num(per_token), bytes=bold(esc(fmt_bytes(model['kv_cache_bytes']))))]
    return "<div class='tt-formula'>" + "<br>".join(lines) + "</div>"
