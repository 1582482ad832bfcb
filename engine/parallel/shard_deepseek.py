"""Tensor and expert parallelism for DeepSeek V2 / V3 (engine/parallel/shard.py calls these).

Multi-head latent attention, rank r of N: query heads [r*H/N, (r+1)*H/N) — rows of q_proj
(or q_b_proj) and of kv_b_proj, which rebuilds those heads' K and V from the latent, and
columns of o_proj (a partial sum: the all-reduce after it, as for other models). The
latent itself is not split: kv_a_proj_with_mqa, kv_a_layernorm (and q_a_proj with its norm)
are replicated, so every rank computes every token's latent and keeps it in its own pool:
each rank's pool holds the whole latent (kv_lora_rank + qk_rope_head_dim numbers a token a
layer), not 1/N of it — MLA's cache is already one "KV head", there is nothing to divide.

DeepSeek MoE: tensor parallel splits every expert's columns and the shared experts' like a
dense MLP; expert parallel keeps whole routed experts [r*E/N, (r+1)*E/N) on rank r, routes
every token over all of them with the replicated router (sigmoid / softmax, bias, groups:
unchanged), and splits the shared experts by columns, so each rank's output is a partial sum
for ReduceMoE's all-reduce.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from engine.batch import ForwardBatch
from engine.config import ModelConfig
from engine.layers.deepseek_moe import DeepseekMoE
from engine.layers.mlp import MLP
from engine.parallel.local_experts import local_expert_sum
from engine.trace.capture import PassCapture

_HEAD_ROWS = ("self_attn.q_proj.weight", "self_attn.q_b_proj.weight", "self_attn.kv_b_proj.weight")


def check_mla(cfg: ModelConfig, n: int, expert_parallel: bool) -> None:
    """Raise ValueError, saying why, when this DeepSeek model cannot be split n ways."""
    if cfg.num_heads % n:
        raise ValueError(f"tensor_parallel_size={n} does not divide the model's {cfg.num_heads} attention heads: "
                         f"multi-head latent attention is split by query heads (the latent is kept whole on every "
                         f"rank), so choose a size that divides {cfg.num_heads}")
    sizes = {"intermediate_size": cfg.intermediate_size}
    if cfg.is_moe:
        shared = cfg.moe_intermediate_size * cfg.deepseek_moe.n_shared_experts
        if expert_parallel:
            if cfg.num_experts % n:
                raise ValueError(f"expert parallelism over {n} ranks needs a number of routed experts that {n} "
                                 f"divides (the model has {cfg.num_experts})")
            sizes["the shared experts' columns (moe_intermediate_size x n_shared_experts)"] = shared
        else:
            sizes["moe_intermediate_size"] = cfg.moe_intermediate_size
    for name, size in sizes.items():
        if size % n:
            raise ValueError(f"tensor_parallel_size={n} does not divide the model's {name} ({size})")


def shard_mla_tensor(name: str, w: torch.Tensor, r: int, n: int) -> torch.Tensor | None:
    """Rank r's rows of a per-head MLA projection (heads are contiguous row blocks), or None
    for a parameter shard.py's own rules cover (o_proj, MLPs, experts; the rest replicated)."""
    if name.endswith(_HEAD_ROWS):
        return w.chunk(n, dim=0)[r]
    return None


class DeepseekExpertParallelMoE(DeepseekMoE):
    """DeepseekMoE holding routed experts [first, first + num_local) and 1/N of the shared
    experts' columns, routing over all experts (the router is whole on every rank)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, first: int, num_local: int, world_size: int) -> None:
        super().__init__(replace(cfg, num_experts=num_local), layer_idx)
        self.gate = type(self.gate)(cfg)  # the router's width: all experts
        self.num_experts, self.first, self.num_local = cfg.num_experts, first, num_local
        n_shared = cfg.deepseek_moe.n_shared_experts
        self.shared_experts = MLP(cfg.hidden_size, cfg.moe_intermediate_size * n_shared // world_size) \
            if n_shared else None

    def pack(self, on: bool = True, dtype: torch.dtype | None = None) -> None:
        pass  # forward's per-expert loop reads the plain weights

    def forward(self, x: torch.Tensor, batch: ForwardBatch | None = None,
                capture: PassCapture | None = None) -> torch.Tensor:
        detail = {} if capture is not None else None
        experts, weights = self.route(x, detail)
        weights = weights.to(x.dtype)
        out = local_expert_sum(x, experts, weights, self.first, self.num_local, self._expert)
        if self.shared_experts is not None:  # its columns split: a partial sum like the experts'
            out = out + self.shared_experts(x)
        if capture is not None:
            capture.moe_routing[self.layer_idx] = (experts, weights)
            capture.moe_detail[self.layer_idx] = detail
        return out

