"""DeepSeek V2 / V3 config.json files -> ModelConfig, with the two things these models
add: multi-head latent attention (MLA, `MLAConfig`) and DeepSeek's MoE (`DeepseekMoEConfig`).

MLA: each token's keys and values are compressed into one latent of kv_lora_rank numbers,
plus one RoPE'd key of qk_rope_head_dim numbers shared by every head (the "decoupled"
key). The KV pool keeps only those (ModelConfig.kv_layout); K and V per head are rebuilt
from the latent with kv_b_proj, or that projection is folded into the query and output
(engine/layers/mla.py). YaRN stretches the RoPE, and its mscale enters the softmax scale.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.config_support import SUPPORTED_ACTIVATIONS, UnsupportedModelError, read_rope

Config = TypeVar("Config")  # ModelConfig, which hands itself in: that module imports this one

ROPE_TYPES = ("default", "linear", "yarn")  # what DeepSeek's files use (V2/V3: yarn)
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


@dataclass(frozen=True)
class MLAConfig:
    q_lora_rank: int | None  # None: one q_proj (V2-Lite); else q_a_proj -> norm -> q_b_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool  # the checkpoint's RoPE dims come in (even, odd) pairs
    scale: float  # the softmax scale: qk_head_dim^-1/2, times YaRN's mscale squared

    @property
    def latent_dim(self) -> int:
        """Numbers the pool keeps per token per layer (DeepSeek-V3: 512 + 64 = 576)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class DeepseekMoEConfig:
    n_shared_experts: int  # experts every token passes through, beside the routed ones
    scoring: str  # "softmax" (V2) or "sigmoid" (V3)
    topk_method: str  # "greedy", "group_limited_greedy" (V2: group score = its best expert),
    #                   "noaux_tc" (V3: biased scores, group score = sum of its best two)
    n_group: int  # experts split into this many groups; routing keeps only the best topk_group
    topk_group: int
    routed_scaling_factor: float
    correction_bias: bool  # V3: e_score_correction_bias added for the choice, not the weight


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def from_hf(cls: type[Config], arch: str, family: str, cfg: dict[str, Any]) -> Config:
    act = cfg.get("hidden_act") or "silu"
    if act not in SUPPORTED_ACTIVATIONS:
        raise UnsupportedModelError(f"unsupported hidden activation {act!r}")
    v3 = family == "deepseek_v3"
    n_layers, n_heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    theta, scaling = read_rope(cfg, ROPE_TYPES)
    if scaling is not None and scaling["rope_type"] == "yarn":
        # DeepSeek-V3's files name the pre-training length; the factor defaults to the ratio
        scaling.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings", 2048))
        if scaling.get("factor") is None:
            scaling["factor"] = cfg["max_position_embeddings"] / scaling["original_max_position_embeddings"]
    mla = _mla(cfg, v3, scaling)
    experts = cfg.get("n_routed_experts") or 0
    first_dense = cfg.get("first_k_dense_replace", 3 if v3 else 0) or 0
    if (cfg.get("moe_layer_freq") or 1) != 1:
        raise UnsupportedModelError("moe_layer_freq other than 1 is not supported")
    moe = _moe(cfg, v3, experts) if experts else None
    eos = cfg.get("eos_token_id")
    return cls(
        architecture=arch, family=family, vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
        num_layers=n_layers, num_heads=n_heads,
        num_kv_heads=1,  # the one latent every head reads (MQA over the latent, as decode runs it)
        head_dim=mla.qk_head_dim, intermediate_size=cfg.get("intermediate_size", 0),
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        rope_theta=theta, rope_scaling=scaling, tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm="none", qkv_bias=bool(cfg.get("attention_bias", False)),
        o_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)) and not v3, clip_qkv=None,
        sliding_windows=[None] * n_layers,
        moe_layers=[bool(experts) and i >= first_dense for i in range(n_layers)],
        num_experts=experts, num_experts_per_tok=cfg.get("num_experts_per_tok", 0) if experts else 0,
        moe_intermediate_size=cfg.get("moe_intermediate_size", 0) if experts else 0,
        norm_topk_prob=bool(cfg.get("norm_topk_prob", v3)),
        eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []), bos_token_id=cfg.get("bos_token_id"),
        torch_dtype=cfg.get("dtype") or cfg.get("torch_dtype"), hidden_act="silu" if act == "swish" else act,
        mla=mla, deepseek_moe=moe)


def _mla(cfg: dict, v3: bool, scaling: dict | None) -> MLAConfig:
    nope, rope = cfg.get("qk_nope_head_dim", 128), cfg.get("qk_rope_head_dim", 64)
    scale = (nope + rope) ** -0.5
    if scaling is not None and scaling.get("mscale_all_dim"):  # YaRN: both q and k carry the mscale
        m = yarn_mscale(scaling["factor"], scaling["mscale_all_dim"])
        scale = scale * m * m
    if rope % 2:
        raise UnsupportedModelError(f"qk_rope_head_dim must be even, got {rope}")
    return MLAConfig(q_lora_rank=cfg.get("q_lora_rank"), kv_lora_rank=cfg.get("kv_lora_rank", 512),
                     qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=cfg.get("v_head_dim", 128),
                     rope_interleave=bool(cfg.get("rope_interleave", True)) if v3 else True, scale=scale)


def _moe(cfg: dict, v3: bool, experts: int) -> DeepseekMoEConfig:
    method = cfg.get("topk_method") or ("noaux_tc" if v3 else "greedy")
    if v3:  # transformers' DeepseekV3 routes this way whatever topk_method says
        method = "noaux_tc"
    if method not in TOPK_METHODS:
        raise UnsupportedModelError(f"unsupported topk_method {method!r}; supported: {', '.join(TOPK_METHODS)}")
    n_group = cfg.get("n_group") or 1
    topk_group = cfg.get("topk_group") or n_group
    if experts % n_group or not 1 <= topk_group <= n_group:
        raise UnsupportedModelError(f"{experts} experts in n_group={n_group} groups, topk_group={topk_group}: "
                                    "the groups must split the experts evenly and topk_group <= n_group")
    k = cfg.get("num_experts_per_tok", 0)
    if method != "greedy" and k > topk_group * (experts // n_group):
        raise UnsupportedModelError(f"num_experts_per_tok={k} exceeds the experts of topk_group={topk_group} groups")
    return DeepseekMoEConfig(n_shared_experts=cfg.get("n_shared_experts") or 0,
                             scoring="sigmoid" if v3 else (cfg.get("scoring_func") or "softmax"),
                             topk_method=method, n_group=n_group, topk_group=topk_group,
                             routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
                             correction_bias=v3)
