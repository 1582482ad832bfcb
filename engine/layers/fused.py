"""A decoder layer's decode step in one C call (engine/kernels/cpu_layer.c), where it applies.

A CPU decode step at a few rows spends most of its time streaming weights, which the C
linear kernel does near the memory's speed; what is left is ~15 small PyTorch ops a
layer around the matmuls, each a few microseconds of dispatch and Python: 4-5 ms of a
20 ms SmolLM2 step. The fused call runs the same kernels with that glue in C.

It applies to a Llama-style layer (RMSNorm, attention with RoPE and no q/k norm or
clipping, dense SwiGLU MLP) whose four projections hold the C kernel's blocked weights,
on float32 CPU rows of a pass in which every sequence decodes one token. Everything else
(prefill, mixed batches, MoE, Gemma, quantized or sharded layers) takes the modules.
A `full` trace still gets what it reads from a layer: the rotated queries (layer_q).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
from torch import nn

from engine.batch import ForwardBatch
from engine.kernels import cpu as cpu_kernels
from engine.layers.linear import Linear

_P, _L, _F = ctypes.c_void_p, ctypes.c_long, ctypes.c_float


class LayerArgs(ctypes.Structure):
    """cpu_layer.c's tt_layer, field for field."""
    _fields_ = [("hidden", _L), ("heads", _L), ("kv_heads", _L), ("head_dim", _L), ("inter", _L),
                ("block_size", _L), ("window", _L), ("eps", _F), ("norm_offset", _F), ("scale", _F),
                ("norm1", _P), ("norm2", _P), ("qkv", _P), ("qkv_bias", _P), ("o", _P), ("o_bias", _P),
                ("gate_up", _P), ("gate_up_bias", _P), ("down", _P), ("down_bias", _P),
                ("k_cache", _P), ("v_cache", _P)]


@dataclass
class FusedLayer:
    """The arguments of one layer, and the tensors they point into (kept alive here; the
    plan is rebuilt when a projection's blocked copy or the KV pool is replaced)."""
    args: LayerArgs
    keep: tuple  # the BlockedWeights, float32 norm weights and biases, the cache views

    def current(self, layer: nn.Module) -> bool:
        attn, mlp = layer.self_attn, layer.mlp
        return (self.keep[0] is attn.qkv_proj.blocked and self.keep[1] is attn.o_proj.blocked
                and self.keep[2] is mlp.gate_up_proj.blocked and self.keep[3] is mlp.down_proj.blocked
                and self.keep[4].data_ptr() == attn.k_cache.data_ptr())


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().float().contiguous()


def plan(layer: nn.Module) -> FusedLayer | None:
    """The fused call's arguments for this DecoderLayer, or None where it does not apply."""
    from engine.layers.mlp import MLP, ACTIVATIONS
    attn, mlp = layer.self_attn, layer.mlp
    if getattr(layer, "sandwich", True) or type(mlp) is not MLP or mlp.act is not ACTIVATIONS["silu"] \
            or attn.qk_norm != "none" or attn.clip_qkv is not None or attn.k_cache.dtype != torch.float32 \
            or attn.k_cache.device.type != "cpu" or not attn.k_cache.is_contiguous() or cpu_kernels.library() is None:
        return None
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    if any(type(m) is not Linear or m.blocked is None for m in linears):
        return None
    n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
    if n1.offset != n2.offset or n1.eps != n2.eps:
        return None
    w1, w2 = _f32(n1.weight), _f32(n2.weight)
    biases = [_f32(m.bias) for m in linears]
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    args = LayerArgs(
        hidden=attn.qkv_proj.in_features, heads=attn.num_heads, kv_heads=attn.num_kv_heads,
        head_dim=attn.head_dim, inter=mlp.down_proj.in_features, block_size=attn.k_cache.shape[1],
        window=attn.window or 0, eps=n1.eps, norm_offset=1.0 if n1.offset else 0.0, scale=attn.scale,
        norm1=w1.data_ptr(), norm2=w2.data_ptr(),
        qkv=linears[0].blocked.data.data_ptr(), qkv_bias=ptr(biases[0]),
        o=linears[1].blocked.data.data_ptr(), o_bias=ptr(biases[1]),
        gate_up=linears[2].blocked.data.data_ptr(), gate_up_bias=ptr(biases[2]),
        down=linears[3].blocked.data.data_ptr(), down_bias=ptr(biases[3]),
        k_cache=attn.k_cache.data_ptr(), v_cache=attn.v_cache.data_ptr())
    return FusedLayer(args, (*(m.blocked for m in linears), attn.k_cache, attn.v_cache, w1, w2, *biases))


def applies(x: torch.Tensor, batch: ForwardBatch) -> bool:
    """Whether this pass's rows can take the fused layer: float32 CPU rows, one new token
    per sequence, few enough for the C linear kernel."""
    group = batch.decode_group
    return (x.dtype == torch.float32 and x.device.type == "cpu" and not batch.use_triton
            and x.shape[0] <= cpu_kernels.MAX_ROWS and group is not None and group.rows is None)


def forward(fused: FusedLayer, layer: nn.Module, positions: torch.Tensor, x: torch.Tensor,
            batch: ForwardBatch) -> torch.Tensor:
    attn = layer.self_attn
    T = x.shape[0]
    x = x.contiguous()
    cos, sin = (t.reshape(T, -1) for t in batch.rope[attn.rope])
    group = batch.decode_group
    out = torch.empty_like(x)
    q = None
    if attn.layer_idx in batch.attention_capture_layers:  # a full trace reads the queries after the pass
        q = torch.empty(T, attn.num_heads, attn.head_dim)
        batch.layer_q[attn.layer_idx] = q
    rc = cpu_kernels.library().tt_decode_layer(
        ctypes.byref(fused.args), x.data_ptr(), T, cos.data_ptr(), sin.data_ptr(), batch.slot_mapping.data_ptr(),
        group.block_tables.data_ptr(), group.block_tables.shape[1], group.context_lens.data_ptr(),
        out.data_ptr(), None if q is None else q.data_ptr(), torch.get_num_threads())
    if rc:
        raise MemoryError(f"cpu_layer: no memory for the scratch rows of {T} tokens")
    return out
