"""The decoder-only transformer shared by the Llama, MoE and Gemma 3 families.

Read top to bottom: embed -> L x (RMSNorm, attention, residual, RMSNorm,
MLP or MoE, residual) -> RMSNorm -> LM head. Gemma 3 adds a few switches, all
read from the config: embeddings scaled by sqrt(hidden), norms that scale by
(1 + weight), a norm after attention and after the MLP too ("sandwich"), local
(sliding-window) layers with their own RoPE base between global ones, and GeGLU.
Parameter names follow the Hugging Face checkpoints, except that q/k/v and
gate/up are fused and experts are stacked; `checkpoint_target` maps a
checkpoint name onto them.
"""
from __future__ import annotations

import re

import torch
from torch import nn

from engine.batch import ForwardBatch
from engine.config import ModelConfig
from engine.layers import fused
from engine.layers.attention import Attention
from engine.layers.deepseek_moe import DeepseekMoE
from engine.layers.linear import Embedding, Linear
from engine.layers.mla import MLAttention
from engine.layers.mlp import MLP, SparseMoE
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.trace.capture import PassCapture


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = MLAttention(cfg, layer_idx) if cfg.mla is not None else Attention(cfg, layer_idx)
        moe = DeepseekMoE if cfg.deepseek_moe is not None else SparseMoE
        self.mlp = moe(cfg, layer_idx) if cfg.moe_layers[layer_idx] \
            else MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.hidden_act)
        norm = lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)  # noqa: E731
        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        self.sandwich = cfg.sandwich_norms
        if self.sandwich:  # Gemma: post_attention_layernorm normalises the attention output instead
            self.pre_feedforward_layernorm = norm()
            self.post_feedforward_layernorm = norm()
        # a CPU pass of a few rows through C calls (fused): the attention is of that kind
        self.fusable = cfg.qk_norm in ("none", "head") and cfg.clip_qkv is None and cfg.mla is None
        self.fused: fused.FusedLayer | None = None

    def _fused_plan(self, x: torch.Tensor, batch: ForwardBatch) -> fused.FusedLayer | None:
        """The fused C calls' plan where this pass can take them, else None."""
        if not (self.fusable and fused.applies(x, batch, fused.widest_rows())):
            return None
        if self.fused is None or not self.fused.current(self):
            self.fused = fused.plan(self)  # None where the weights are not the C kernels'
        return self.fused if self.fused is not None and x.shape[0] <= self.fused.max_rows else None

    def forward(self, positions: torch.Tensor, x: torch.Tensor, batch: ForwardBatch,
                capture: PassCapture | None = None) -> torch.Tensor:
        plan = self._fused_plan(x, batch)
        if plan is None:
            h = self.self_attn(positions, self.input_layernorm(x), batch, capture)
            x = x + (self.post_attention_layernorm(h) if self.sandwich else h)
        else:
            x = fused.forward(plan, self, x, batch, capture)
            if plan.mlp:
                return x
        if self.sandwich:  # Gemma: a norm before the MLP and one on its output
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x), batch, capture))
        return x + self.mlp(self.post_attention_layernorm(x), batch, capture)  # a MoE's experts run here either way


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.rotary = RotaryEmbedding(cfg.rotary_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.rotary_local = None  # Gemma 3: the sliding-window layers' own RoPE base
        if cfg.local_rope_theta is not None:
            self.rotary_local = RotaryEmbedding(cfg.head_dim, max_positions, cfg.local_rope_theta,
                                                cfg.local_rope_scaling)
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_scale = cfg.embed_scale
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)

    def cover_positions(self, n: int) -> None:
        """RoPE tables for positions [0, n): they grow with the longest pass (RotaryEmbedding)."""
        self.rotary.cover(n)
        if self.rotary_local is not None:
            self.rotary_local.cover(n)

    def forward(self, batch: ForwardBatch, capture: PassCapture | None = None) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        if not batch.static_shapes:  # a CUDA graph's batch: the runner covered every position before capture
            self.cover_positions(max(batch.context_lens, default=0))
        if self.embed_scale is not None:  # Gemma: sqrt(hidden), rounded to the model's dtype first
            x = x * torch.tensor(self.embed_scale).to(x.dtype).item()
        lens = None
        st = fused.stack(self, x, batch)  # every layer in one C call, the final norm too (else None)
        if capture is not None:
            # logit lens: the residual stream at the sampled rows before each layer (after the last
            # one it is the model's own output: engine/trace/logit_lens.py)
            lens = capture.lens_rows
            # the one-call stack's decode (every row a lens row) takes the embedding rows from the lens's
            # layer-0 rows after the pass (fused.stack_forward): no view of x to make here, a cold torch op
            later = st is not None and fused.embed_rows_in_lens(capture, x.shape[0])
            for b, spec in enumerate(capture.specs):
                if spec is not None and spec.embed_dims:
                    capture.embed_rows[b] = None if later else x[batch.seq_slice(b), : spec.embed_dims]
        if st is not None:
            return fused.stack_forward(st, x, batch, self, capture)  # (and a full trace's captures)
        # cos/sin looked up once per pass for each table; every layer reads its own
        batch.rope = {"global": self.rotary.lookup(batch.positions, x.dtype)}
        if self.rotary_local is not None:
            batch.rope["local"] = self.rotary_local.lookup(batch.positions, x.dtype)
        # every row a lens row (a traced decode step of one sequence, its verify pass): x itself,
        # which no layer writes to (each returns a new tensor); the engine marks rows in order
        whole = lens is not None and len(lens) == x.shape[0]
        index = None if lens is None or whole else torch.tensor(lens, dtype=torch.long, device=x.device)
        for layer in self.layers:
            if lens is not None:
                capture.lens_hidden.append(x if whole else x.index_select(0, index))
            x = layer(batch.positions, x, batch, capture)
        return self.norm(x)


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg, max_positions)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, batch: ForwardBatch, capture: PassCapture | None = None) -> torch.Tensor:
        """Final hidden states for every token in the batch: [T, hidden]. A traced pass
        keeps what `capture` asks for in it (PassCapture)."""
        return self.model(batch, capture)

    def compute_logits(self, hidden: torch.Tensor, exact_rows: int = 0) -> torch.Tensor:
        """exact_rows: the first rows are the logit lens's: at bfloat16 their x is not rounded
        (the lens's chosen-token ranks stay the exact ones; the model's own rows are as untraced)."""
        head = self.lm_head
        logits = head(hidden, exact_rows) if exact_rows and type(head) is Linear else head(hidden)
        if cap := self.config.final_logit_softcapping:  # squash into (-cap, cap)
            logits = torch.tanh(logits / cap) * cap
        return logits

    def attention_layers(self) -> list[Attention | MLAttention]:
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
# Gemma3ForConditionalGeneration: its language model's tensors (transformers >= 5, and
# older files), and the vision tower and projector we do not run
_LANGUAGE_MODEL_RE = re.compile(r"^(?:model\.language_model|language_model\.model)\.")
IGNORED = re.compile(r"rotary_emb\.inv_freq$|^(?:model\.)?(?:vision_tower|multi_modal_projector)\.")


def checkpoint_target(name: str, fused_qkv: bool = True) -> tuple[str, int | None, int | None]:
    """Map a checkpoint tensor name to (parameter name, expert index, shard index).

    shard: which part of a fused parameter (q/k/v or gate/up) the tensor fills.
    fused_qkv=False: an MLA model, whose q_proj stays its own.
    """
    name = _LANGUAGE_MODEL_RE.sub("model.", name)
    if name.startswith("language_model.lm_head."):
        name = name.removeprefix("language_model.")
    name = name.replace(".block_sparse_moe.gate.", ".mlp.gate.")
    if m := _EXPERT_RE.match(name):
        param, shard = _EXPERT[m.group(3)]
        return f"{m.group(1)}.mlp.{param}", int(m.group(2)), shard
    if m := _FUSED_EXPERTS_RE.match(name):  # transformers >= 5 in-memory layout
        return f"{m.group(1)}.mlp.experts_{m.group(2).replace('_proj', '')}", None, None
    if (m := _PROJ_RE.match(name)) and (fused_qkv or m.group(2) not in ("q_proj", "k_proj", "v_proj")):
        param, shard = _FUSED[m.group(2)]
        return f"{m.group(1)}.{param}.{m.group(3)}", None, shard
    return name, None, None


def shard_sizes(cfg: ModelConfig, param: str) -> list[int]:
    """Row sizes of the parts of a fused parameter, in shard order."""
    if param.endswith("qkv_proj.weight") or param.endswith("qkv_proj.bias"):
        return [cfg.num_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2
    if "shared_experts." in param:  # DeepSeek: n_shared_experts experts as one MLP
        return [cfg.moe_intermediate_size * cfg.deepseek_moe.n_shared_experts] * 2
    if "shared_expert." in param:
        return [cfg.shared_expert_intermediate_size] * 2
    if param.endswith("experts_gate_up"):
        return [cfg.moe_intermediate_size] * 2
    return [cfg.intermediate_size] * 2
