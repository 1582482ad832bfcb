"""llama.cpp's `deepseek2` GGUF files (DeepSeek V2, V2-Lite, V3, R1, Kimi K2) as a
DeepseekV2 / DeepseekV3 config.json and checkpoint names.

What llama.cpp's converter (convert_hf_to_gguf.py, DeepseekV2Model) changes, undone here:
- it writes MLA as multi-query attention over the latent: head_count_kv = 1,
  key_length = kv_lora_rank + qk_rope_head_dim, value_length = kv_lora_rank; the per-head
  sizes go in key_length_mla / value_length_mla (older files: key_length = nope + rope,
  value_length = v_head_dim, and no *_mla keys);
- it splits kv_b_proj per head into attn_k_b (W_UK transposed, [H, rank, nope]) and
  attn_v_b ([H, v, rank]) for its absorbed decode (older files: one attn_kv_b);
- V3's e_score_correction_bias becomes blk.N.exp_probs_b.bias; the gating function
  (1 softmax, 2 sigmoid) says which of V2 / V3 the file was;
- YaRN's mscale_all_dim is stored as rope.scaling.yarn_log_multiplier = 0.1 * mscale_all_dim.
It does not permute Q/K rows: the checkpoint's interleaved RoPE is kept as it is.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from engine.checkpoint.errors import ModelLoadError
from engine.checkpoint.gguf_reader import meta, open_gguf

GATING_SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID

# blk.N.<kind> -> the module under model.layers.N. (suffix .weight / .bias kept)
BLOCK = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_q_a": "self_attn.q_a_proj", "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj", "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm", "attn_kv_b": "self_attn.kv_b_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj", "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
}
SPLIT_KV_B = ("attn_k_b", "attn_v_b")  # joined back into one kv_b_proj


def block_name(prefix: str, kind: str, suffix: str) -> str | None:
    """The HF name of blk.N.<kind>.<suffix>, or None for a kind this file type lacks."""
    if kind == "exp_probs_b":
        return f"{prefix}mlp.gate.e_score_correction_bias"
    return f"{prefix}{BLOCK[kind]}.{suffix}" if kind in BLOCK else None


def config(key: Callable[..., Any], tensors: dict, cfg: dict[str, Any], n_heads: int) -> dict[str, Any]:
    """The DeepSeek fields of the config dict read_config builds (cfg: its common fields)."""
    rope = key("rope.dimension_count")
    rank = key("attention.kv_lora_rank")
    if rope is None or rank is None:
        raise ModelLoadError("deepseek2 GGUF file lacks deepseek2.rope.dimension_count or "
                             "deepseek2.attention.kv_lora_rank")
    if key("attention.key_length_mla") is not None:  # files since llama.cpp's MLA decode (2025)
        qk_head, v_head = key("attention.key_length_mla"), key("attention.value_length_mla")
    else:
        qk_head, v_head = key("attention.key_length"), key("attention.value_length")
    if qk_head is None or v_head is None:
        raise ModelLoadError("deepseek2 GGUF file states no per-head key / value length")
    v3 = key("expert_gating_func") == GATING_SIGMOID or any(name.endswith(".exp_probs_b.bias") for name in tensors)
    experts = key("expert_count")
    n_group = key("expert_group_count") or 1
    out = {
        "architectures": ["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v3" if v3 else "deepseek_v2",
        "num_key_value_heads": n_heads,  # as in the source config (the file says 1: MQA over the latent)
        "q_lora_rank": key("attention.q_lora_rank"), "kv_lora_rank": rank,
        "qk_rope_head_dim": rope, "qk_nope_head_dim": qk_head - rope, "v_head_dim": v_head,
        "rope_interleave": True,
        "n_routed_experts": experts, "num_experts_per_tok": key("expert_used_count") if experts else None,
        "moe_intermediate_size": key("expert_feed_forward_length", 0),
        "n_shared_experts": key("expert_shared_count", 0),
        "first_k_dense_replace": key("leading_dense_block_count", 0),
        "routed_scaling_factor": float(key("expert_weights_scale", 1.0) or 1.0),
        "norm_topk_prob": bool(key("expert_weights_norm", False)),
        "n_group": n_group, "topk_group": key("expert_group_used_count") or n_group,
        "scoring_func": "sigmoid" if v3 else "softmax",
        "topk_method": "noaux_tc" if v3 else ("group_limited_greedy" if n_group > 1 else "greedy"),
    }
    scaling = cfg.get("rope_scaling")
    if scaling is not None and scaling["rope_type"] == "yarn":
        scaling = dict(scaling)
        if log_mul := key("rope.scaling.yarn_log_multiplier"):
            # llama.cpp keeps one mscale: mscale and mscale_all_dim equal, their ratio (on cos/sin) is 1
            scaling["mscale"] = scaling["mscale_all_dim"] = log_mul / 0.1
        for name in ("beta_fast", "beta_slow"):
            if (v := key(f"rope.scaling.yarn_{name}")) is not None:
                scaling[name] = v
        out["rope_scaling"] = scaling
    return out


class KVBJoiner:
    """Collects a layer's attn_k_b and attn_v_b (adjacent in the file) and gives back the
    kv_b_proj they were cut from: per head [nope rows of W_UK; v rows of W_UV] x rank."""

    def __init__(self) -> None:
        self.parts: dict[str, dict[str, torch.Tensor]] = {}

    def add(self, layer: str, kind: str, w: torch.Tensor) -> torch.Tensor | None:
        parts = self.parts.setdefault(layer, {})
        parts[kind] = w
        if len(parts) < 2:
            return None
        del self.parts[layer]
        k_b, v_b = parts["attn_k_b"], parts["attn_v_b"]  # [H, rank, nope], [H, v, rank]
        if k_b.dim() != 3 or v_b.dim() != 3 or k_b.shape[0] != v_b.shape[0] or k_b.shape[1] != v_b.shape[2]:
            raise ModelLoadError(f"blk.{layer}.attn_k_b {tuple(k_b.shape)} and attn_v_b {tuple(v_b.shape)} "
                                 "do not split one kv_b_proj")
        kv_b = torch.cat([k_b.transpose(1, 2), v_b], dim=1)  # [H, nope + v, rank]
        return kv_b.reshape(-1, kv_b.shape[-1])

    def check_done(self) -> None:
        if self.parts:
            layer, parts = next(iter(self.parts.items()))
            raise ModelLoadError(f"blk.{layer} has {', '.join(parts)} without its other half")


# tokenizer.ggml.pre "deepseek-v3" (V3, R1): how DeepSeek's tokenizer.json splits text before
# the byte-level BPE (llama.cpp's llama-vocab.cpp has the same three expressions): numbers in
# runs of up to three digits, CJK runs, then words and punctuation.
DEEPSEEK_V3_SPLITS = (
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)


def load_tokenizer(path):
    """A deepseek2 file's tokenizer, or None for other files. transformers converts GGUF
    vocabularies only for architectures it runs, and deepseek2 is not one: its byte-level
    BPE is read as a gpt2 one, then split the way DeepSeek-V3's own tokenizer splits."""
    from tokenizers import Regex, pre_tokenizers
    from transformers import AutoTokenizer

    reader = open_gguf(path)
    if meta(reader, "general.architecture") != "deepseek2":
        return None
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, tokenizer_type="gpt2",
                                       trust_remote_code=False)
    if meta(reader, "tokenizer.ggml.pre") == "deepseek-v3":
        hf.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in DEEPSEEK_V3_SPLITS]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return hf
