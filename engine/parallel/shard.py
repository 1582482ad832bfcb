"""Which slice of each weight a rank holds, and the layers that sum the partial results.

Tensor parallel (Megatron-style), rank r of N:
- attention: KV heads [r*K/N, (r+1)*K/N) with the query heads that read them (GQA groups
  stay whole), so q/k/v are column slices of qkv_proj, o_proj a row slice of its input;
  each rank's o_proj gives a partial sum of the output: one all-reduce per layer;
- MLP: intermediate columns [r*I/N, (r+1)*I/N) of gate and up, the same rows of down's
  input; one all-reduce after down_proj. MoE blocks the same per expert (and the shared
  expert), summed in one all-reduce after the block;
- biases of the summed outputs (o_proj, down_proj) live on rank 0 only (else added N times);
- embedding, norms, router and LM head are replicated: every rank holds the whole vector
  of every token between the layers.
Expert parallel: MoE blocks instead keep whole experts, experts [r*E/N, (r+1)*E/N) on rank
r; every rank routes every token (the router is replicated, so routing is unchanged), runs
the tokens sent to its own experts, and the all-reduce after the block brings every
token's weighted sum back to every rank.
DeepSeek (multi-head latent attention, DeepSeek MoE): shard_deepseek.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from engine.batch import ForwardBatch
from engine.config import ModelConfig
from engine.layers.mlp import SparseMoE
from engine.model import CausalLM
from engine.parallel.comm import Comm
from engine.parallel.local_experts import local_expert_sum
from engine.parallel.shard_deepseek import DeepseekExpertParallelMoE, check_mla, shard_mla_tensor
from engine.trace.capture import PassCapture


@dataclass
class Placement:
    """Where things live: rank -> query heads, KV heads, experts (global indices)."""
    world_size: int
    expert_parallel: bool
    heads: list[list[int]]
    kv_heads: list[list[int]]
    experts: list[list[int]]  # empty lists for a dense model
    intermediate: list[tuple[int, int]]  # dense MLP columns [lo, hi) per rank
    latent: bool = False  # MLA: no KV heads to split, every rank keeps the whole latent (kv_heads [0])

    def as_dict(self) -> dict:
        return {"world_size": self.world_size, "expert_parallel": self.expert_parallel, "latent": self.latent,
                "ranks": [{"rank": r, "heads": self.heads[r], "kv_heads": self.kv_heads[r],
                           "experts": self.experts[r], "intermediate": list(self.intermediate[r])}
                          for r in range(self.world_size)]}


def check_shardable(cfg: ModelConfig, n: int, expert_parallel: bool) -> None:
    """Raise ValueError, saying why, when this model cannot be split n ways."""
    if n < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {n}")
    if expert_parallel and not cfg.is_moe:
        raise ValueError(f"expert parallelism needs a mixture-of-experts model; {cfg.architecture} is dense")
    if n == 1:
        return
    if cfg.mla is not None:  # DeepSeek: split by query heads, the latent whole on every rank
        return check_mla(cfg, n, expert_parallel)
    if cfg.num_kv_heads % n:
        raise ValueError(f"tensor_parallel_size={n} does not divide the model's {cfg.num_kv_heads} KV heads: "
                         f"attention is split by KV-head groups (query heads stay with their KV head), so "
                         f"choose a size that divides {cfg.num_kv_heads}")
    if cfg.qk_norm == "full":
        raise ValueError(f"{cfg.architecture} normalises q and k over all heads together (qk_norm over the whole "
                         "projection); splitting its heads across ranks is not supported")
    sizes = {"intermediate_size": cfg.intermediate_size, "shared_expert_intermediate_size":
             cfg.shared_expert_intermediate_size}
    if not expert_parallel:
        sizes["moe_intermediate_size"] = cfg.moe_intermediate_size
    elif cfg.num_experts % n:
        raise ValueError(f"expert parallelism over {n} ranks needs a number of experts that {n} divides "
                         f"(the model has {cfg.num_experts})")
    for name, size in sizes.items():
        if size % n:
            raise ValueError(f"tensor_parallel_size={n} does not divide the model's {name} ({size})")


def placement(cfg: ModelConfig, n: int, expert_parallel: bool) -> Placement:
    h, k, i = cfg.num_heads // n, cfg.num_kv_heads // n, cfg.intermediate_size // n
    e = cfg.num_experts // n if expert_parallel else cfg.num_experts
    return Placement(n, expert_parallel,
                     [list(range(r * h, (r + 1) * h)) for r in range(n)],
                     [[0] for r in range(n)] if cfg.mla is not None else  # MLA: the one latent, on every rank
                     [list(range(r * k, (r + 1) * k)) for r in range(n)],
                     [list(range(r * e, (r + 1) * e)) if expert_parallel else list(range(cfg.num_experts))
                      for r in range(n)] if cfg.is_moe else [[] for _ in range(n)],
                     [(r * i, (r + 1) * i) for r in range(n)], cfg.mla is not None)


def local_config(cfg: ModelConfig, n: int, expert_parallel: bool) -> ModelConfig:
    """The shapes one rank builds: its share of heads and intermediate columns."""
    return replace(cfg, num_heads=cfg.num_heads // n,
                   num_kv_heads=cfg.num_kv_heads if cfg.mla is not None else cfg.num_kv_heads // n,
                   intermediate_size=cfg.intermediate_size // n,
                   moe_intermediate_size=cfg.moe_intermediate_size // (1 if expert_parallel else n),
                   shared_expert_intermediate_size=cfg.shared_expert_intermediate_size // n)


def _halves(w: torch.Tensor, dim: int, r: int, n: int) -> torch.Tensor:
    """Rank r's slice of each half of a fused [gate; up] dimension."""
    gate, up = w.chunk(2, dim=dim)
    return torch.cat([gate.chunk(n, dim=dim)[r], up.chunk(n, dim=dim)[r]], dim=dim)


def shard_tensor(name: str, w: torch.Tensor, cfg: ModelConfig, r: int, n: int, expert_parallel: bool) -> torch.Tensor:
    """Rank r's part of the full model's parameter `name`."""
    if cfg.mla is not None and (part := shard_mla_tensor(name, w, r, n)) is not None:
        return part
    if name.endswith(("qkv_proj.weight", "qkv_proj.bias")):
        q, k, v = w.split([cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim,
                           cfg.num_kv_heads * cfg.head_dim], dim=0)
        return torch.cat([q.chunk(n)[r], k.chunk(n)[r], v.chunk(n)[r]])
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return w.chunk(n, dim=1)[r]
    if name.endswith(("o_proj.bias", "down_proj.bias")):
        return w if r == 0 else torch.zeros_like(w)
    if name.endswith(("gate_up_proj.weight", "gate_up_proj.bias")):
        return _halves(w, 0, r, n)
    if name.endswith("experts_gate_up"):  # [E, 2I, H]
        return w.chunk(n, dim=0)[r] if expert_parallel else _halves(w, 1, r, n)
    if name.endswith("experts_down"):  # [E, H, I]
        return w.chunk(n, dim=0)[r] if expert_parallel else w.chunk(n, dim=2)[r]
    return w  # replicated: embedding, norms, router, LM head, q/k norms per head


class ReduceLinear(nn.Module):
    """A row-parallel projection: this rank's partial product, then summed over the ranks."""

    def __init__(self, inner: nn.Module, comm: Comm, layer: int, what: str) -> None:
        super().__init__()
        self.inner, self.comm, self.layer, self.what = inner, comm, layer, what

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(self.inner(x), self.layer, self.what)


class ReduceMoE(nn.Module):
    """A MoE block whose experts (or expert columns) are split: partial sums, then all-reduce."""

    def __init__(self, inner: nn.Module, comm: Comm, layer: int) -> None:
        super().__init__()
        self.inner, self.comm, self.layer = inner, comm, layer

    def forward(self, x: torch.Tensor, batch: ForwardBatch | None = None,
                capture: PassCapture | None = None) -> torch.Tensor:
        return self.comm.all_reduce(self.inner(x, batch, capture), self.layer, "moe")


class ExpertParallelMoE(SparseMoE):
    """SparseMoE holding only experts [first, first + num_local) but routing over all of them."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, first: int, num_local: int) -> None:
        super().__init__(replace(cfg, num_experts=num_local), layer_idx)
        self.num_experts = cfg.num_experts  # the router's width: routing is global
        self.gate = type(self.gate)(cfg.hidden_size, cfg.num_experts, bias=False)
        self.first, self.num_local = first, num_local

    def pack(self, on: bool = True, dtype: torch.dtype | None = None) -> None:
        pass  # the per-expert path below reads the plain weights

    def forward(self, x: torch.Tensor, batch: ForwardBatch | None = None,
                capture: PassCapture | None = None) -> torch.Tensor:
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)  # routing exactly as SparseMoE
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = local_expert_sum(x, experts, weights, self.first, self.num_local, self._expert)
        if self.shared_expert is not None:  # split by columns like a dense MLP: a partial sum too
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        if capture is not None:
            capture.moe_routing[self.layer_idx] = (experts, weights)
        return out


def shard_model(full: CausalLM, local: CausalLM, cfg: ModelConfig, comm: Comm, expert_parallel: bool) -> CausalLM:
    """Fill `local` (built from local_config) with this rank's slices of `full`, then put
    the all-reduces in: after o_proj, after down_proj, after each MoE block."""
    r, n = comm.rank, comm.world_size
    if expert_parallel:
        per = cfg.num_experts // n
        lcfg = local.config
        for i, layer in enumerate(local.model.layers):
            if cfg.moe_layers[i]:
                moe = DeepseekExpertParallelMoE(lcfg, i, r * per, per, n) if cfg.deepseek_moe is not None else \
                    ExpertParallelMoE(lcfg, i, r * per, per)
                layer.mlp = moe.to(
                    device=layer.input_layernorm.weight.device, dtype=layer.input_layernorm.weight.dtype)
    src = dict(full.named_parameters())
    with torch.no_grad():
        for name, p in local.named_parameters():
            p.copy_(shard_tensor(name, src[name], cfg, r, n, expert_parallel))
    if n > 1:
        for i, layer in enumerate(local.model.layers):
            attn = layer.self_attn
            attn.o_proj = ReduceLinear(attn.o_proj, comm, i, "attention")
            if cfg.moe_layers[i]:
                layer.mlp = ReduceMoE(layer.mlp, comm, i)
            else:
                layer.mlp.down_proj = ReduceLinear(layer.mlp.down_proj, comm, i, "mlp")
    return local
