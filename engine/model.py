"""The decoder-only transformer shared by the Llama and MoE families.

Read top to bottom: embed -> L x (RMSNorm, attention, residual, RMSNorm,
MLP or MoE, residual) -> RMSNorm -> LM head. Parameter names follow the
Hugging Face checkpoints, except that q/k/v and gate/up are fused and experts
are stacked; `checkpoint_target` maps a checkpoint name onto them.
"""
from __future__ import annotations

import re

import torch
from torch import nn

from engine.batch import ForwardBatch
from engine.config import ModelConfig
from engine.layers.attention import Attention
from engine.layers.mlp import MLP, SparseMoE
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = SparseMoE(cfg, layer_idx) if cfg.moe_layers[layer_idx] \
            else MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        x = x + self.self_attn(positions, self.input_layernorm(x), batch)
        return x + self.mlp(self.post_attention_layernorm(x), batch)


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        batch.rope = self.rotary.lookup(batch.positions, x.dtype)
        for b, spec in enumerate(batch.captures):
            if spec is not None and spec.embed_dims:
                batch.embed_rows[b] = x[batch.seq_slice(b), : spec.embed_dims]
        for layer in self.layers:
            x = layer(batch.positions, x, batch)
        return self.norm(x)


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg, max_positions)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Final hidden states for every token in the batch: [T, hidden]."""
        return self.model(batch)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn for layer in self.model.layers]


# --- checkpoint names -> this model's parameters -------------------------------

_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
_EXPERT = {"w1": ("experts_gate_up", 0), "w3": ("experts_gate_up", 1), "w2": ("experts_down", None),
           "gate_proj": ("experts_gate_up", 0), "up_proj": ("experts_gate_up", 1),
           "down_proj": ("experts_down", None)}
_EXPERT_RE = re.compile(r"^(model\.layers\.\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(\w+)\.weight$")
_FUSED_EXPERTS_RE = re.compile(r"^(model\.layers\.\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
_PROJ_RE = re.compile(r"^(.*)\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)$")
IGNORED = re.compile(r"rotary_emb\.inv_freq$")


def checkpoint_target(name: str) -> tuple[str, int | None, int | None]:
    """Map a checkpoint tensor name to (parameter name, expert index, shard index).

    shard: which part of a fused parameter (q/k/v or gate/up) the tensor fills.
    """
    name = name.replace(".block_sparse_moe.gate.", ".mlp.gate.")
    if m := _EXPERT_RE.match(name):
        param, shard = _EXPERT[m.group(3)]
        return f"{m.group(1)}.mlp.{param}", int(m.group(2)), shard
    if m := _FUSED_EXPERTS_RE.match(name):  # transformers >= 5 in-memory layout
        return f"{m.group(1)}.mlp.experts_{m.group(2).replace('_proj', '')}", None, None
    if m := _PROJ_RE.match(name):
        param, shard = _FUSED[m.group(2)]
        return f"{m.group(1)}.{param}.{m.group(3)}", None, shard
    return name, None, None


def shard_sizes(cfg: ModelConfig, param: str) -> list[int]:
    """Row sizes of the parts of a fused parameter, in shard order."""
    if param.endswith("qkv_proj.weight") or param.endswith("qkv_proj.bias"):
        return [cfg.num_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2
    if "shared_expert." in param:
        return [cfg.shared_expert_intermediate_size] * 2
    if param.endswith("experts_gate_up"):
        return [cfg.moe_intermediate_size] * 2
    return [cfg.intermediate_size] * 2
