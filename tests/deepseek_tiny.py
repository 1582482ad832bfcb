"""Tiny random DeepSeek V2 / V3 checkpoints written with transformers' own classes: one
per routing / attention variant (q_lora_rank or not, groups, correction bias, YaRN)."""
from __future__ import annotations

import torch

from tests.tiny import save_tokenizer, scale_weights

BASE = dict(vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
            v_head_dim=12, max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=None)
# name -> (transformers config class, its kwargs)
VARIANTS = {
    # V3: q_lora_rank, 8 experts in 4 groups (2 groups allowed), sigmoid + bias, 1 dense layer first
    "v3_moe": ("DeepseekV3Config", dict(q_lora_rank=24, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                                        n_group=4, topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5)),
    # V3 without q_lora_rank, every layer dense, the checkpoint's RoPE not interleaved
    "v3_dense": ("DeepseekV3Config", dict(q_lora_rank=None, n_routed_experts=8, n_group=1, topk_group=1,
                                          first_k_dense_replace=3, rope_interleave=False)),
    # V2-Lite's shape: no q_lora_rank, softmax greedy routing, 2 shared experts, MoE from layer 1
    "v2_lite": ("DeepseekV2Config", dict(q_lora_rank=None, n_routed_experts=6, n_shared_experts=2,
                                         num_experts_per_tok=2, first_k_dense_replace=1, topk_method="greedy",
                                         routed_scaling_factor=1.0)),
    # V2 with q_lora_rank and group-limited greedy routing, YaRN with mscale in the softmax scale
    "v2_groups_yarn": ("DeepseekV2Config", dict(
        q_lora_rank=24, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3, n_group=4, topk_group=2,
        first_k_dense_replace=0, topk_method="group_limited_greedy", routed_scaling_factor=1.5,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32, "beta_slow": 1,
                         "mscale": 0.707, "mscale_all_dim": 0.707, "original_max_position_embeddings": 64})),
}


def make_deepseek(variant: str, path, seed: int = 3):
    import transformers
    cls_name, extra = VARIANTS[variant]
    model = getattr(transformers, cls_name)(**{**BASE, **extra})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(model, dtype=torch.float32)
    scale_weights(model, seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # a buffer scale_weights leaves at 0: large enough to change choices
        for layer in model.model.layers:
            bias = getattr(getattr(layer.mlp, "gate", None), "e_score_correction_bias", None)
            if bias is not None:
                bias.copy_(0.3 * torch.randn(bias.shape, generator=g))
    model.save_pretrained(str(path))
    save_tokenizer(path)
    return path
