"""A decoder layer's decode step in two C calls (engine/kernels/cpu_layer.c), where it applies.

A CPU decode step at a few rows spends most of its time streaming weights, which the C
linear kernel does near the memory's speed; what is left is ~15 small PyTorch ops a
layer around the matmuls, each a few microseconds of dispatch and Python: 4-5 ms of a
20 ms SmolLM2 step. The fused call runs the same kernels with that glue in C.

The attention half applies to a Llama-style layer (RMSNorm, attention with RoPE and no
q/k norm or clipping) whose q/k/v and o projections hold the C kernel's blocked weights,
on float32 CPU rows of a pass in which every sequence decodes one token; the MLP half
too where it is a dense SwiGLU with blocked weights, while a MoE block runs its own
modules after the fused attention. Everything else (prefill, mixed batches, Gemma,
quantized or sharded layers) takes the modules. A `full` trace still gets what it reads
from a layer: the rotated queries (layer_q) and the MoE routing.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
from torch import nn

from engine.batch import ForwardBatch
from engine.kernels import cpu as cpu_kernels
from engine.layers.linear import Linear
from engine.layers.mlp import ACTIVATIONS, MLP

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
    """The arguments of one layer, and what they point into, kept alive here: the plan is
    rebuilt when a projection's blocked copy or the KV pool is replaced."""
    args: LayerArgs
    mlp: bool  # the MLP half fused too (a dense SwiGLU); else the layer's own MLP or MoE runs it
    weights: list[tuple[Linear, cpu_kernels.BlockedWeight]]  # each fused projection and its copy then
    keep: tuple  # the float32 norm weights and biases, the cache views

    def current(self, layer: nn.Module) -> bool:
        return all(m.blocked is w for m, w in self.weights) and \
            self.keep[0].data_ptr() == layer.self_attn.k_cache.data_ptr()


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().float().contiguous()


def _blocked(m: nn.Module) -> bool:
    return type(m) is Linear and m.blocked is not None


def plan(layer: nn.Module) -> FusedLayer | None:
    """The fused call's arguments for this DecoderLayer (whose `fusable` says the attention
    half is of the kind the C code runs), or None where its weights are not the C kernel's."""
    attn, mlp = layer.self_attn, layer.mlp
    cache = attn.k_cache
    if not (_blocked(attn.qkv_proj) and _blocked(attn.o_proj)) or cache.dtype != torch.float32 \
            or cache.device.type != "cpu" or not cache.is_contiguous() or cpu_kernels.library() is None \
            or attn.num_heads // attn.num_kv_heads > cpu_kernels.MAX_GROUP \
            or attn.head_dim > cpu_kernels.MAX_HEAD_DIM:  # cpu_attention.c's stack buffers
        return None
    n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
    fuse_mlp = type(mlp) is MLP and mlp.act is ACTIVATIONS["silu"] and _blocked(mlp.gate_up_proj) \
        and _blocked(mlp.down_proj) and (n1.offset, n1.eps) == (n2.offset, n2.eps)
    linears = [attn.qkv_proj, attn.o_proj] + ([mlp.gate_up_proj, mlp.down_proj] if fuse_mlp else [])
    w1, w2 = _f32(n1.weight), _f32(n2.weight)
    biases = [_f32(m.bias) for m in linears]
    blocked = [m.blocked.data.data_ptr() for m in linears] + [None, None]
    bias = [None if b is None else b.data_ptr() for b in biases] + [None, None]
    args = LayerArgs(
        hidden=attn.qkv_proj.in_features, heads=attn.num_heads, kv_heads=attn.num_kv_heads,
        head_dim=attn.head_dim, inter=mlp.down_proj.in_features if fuse_mlp else 0,
        block_size=cache.shape[1], window=attn.window or 0, eps=n1.eps,
        norm_offset=1.0 if n1.offset else 0.0, scale=attn.scale, norm1=w1.data_ptr(), norm2=w2.data_ptr(),
        qkv=blocked[0], qkv_bias=bias[0], o=blocked[1], o_bias=bias[1],
        gate_up=blocked[2], gate_up_bias=bias[2], down=blocked[3], down_bias=bias[3],
        k_cache=cache.data_ptr(), v_cache=attn.v_cache.data_ptr())
    return FusedLayer(args, fuse_mlp, [(m, m.blocked) for m in linears],
                      (cache, attn.v_cache, w1, w2, *biases))


def applies(x: torch.Tensor, batch: ForwardBatch) -> bool:
    """Whether this pass's rows can take the fused layer: float32 CPU rows, one new token
    per sequence, few enough for the C linear kernel."""
    group = batch.decode_group
    return (x.dtype == torch.float32 and x.device.type == "cpu" and not batch.use_triton
            and x.shape[0] <= cpu_kernels.MAX_ROWS and group is not None and group.rows is None)


def forward(fused: FusedLayer, layer: nn.Module, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    """The layer's output rows for the decode pass's rows x [T, hidden] (see applies)."""
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
    lib, threads = cpu_kernels.library(), torch.get_num_threads()
    rc = lib.tt_decode_attention_block(
        ctypes.byref(fused.args), x.data_ptr(), T, cos.data_ptr(), sin.data_ptr(), batch.slot_mapping.data_ptr(),
        group.block_tables.data_ptr(), group.block_tables.shape[1], group.context_lens.data_ptr(),
        out.data_ptr(), None if q is None else q.data_ptr(), threads)
    if not rc and fused.mlp:
        rc = lib.tt_decode_mlp_block(ctypes.byref(fused.args), out.data_ptr(), T, threads)
    if rc:
        raise MemoryError(f"cpu_layer: no memory for the scratch rows of {T} tokens")
    if not fused.mlp:  # a MoE (or another MLP): its own modules, routing captures and all
        out = out + layer.mlp(layer.post_attention_layernorm(out), batch)
    return out
