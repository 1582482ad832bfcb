"""Which way a pass's attention and MoE ran, for the trace (schedule.step's `attention` and
`moe`): the names the code map's PATHS give the ways. Read after the pass from the same tests the
layers ask before it (fused.applies and the plan a layer kept,
cpu.attention_applies, the batch's `use_triton`), so nothing is added to
the pass itself; tests/engine/test_code_ran.py runs passes and checks the name against the
functions that were really called. Only a traced step asks."""
from __future__ import annotations

import torch

from engine.batch import ForwardBatch
from engine.kernels import cpu as cpu_kernels
from engine.layers import fused
from engine.layers.attention import Attention
from engine.layers.mlp import SparseMoE


def first_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model's first decoder layer (None: not a CausalLM), the one ways_key reads."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    return layers[0] if layers else None


def ways_key(model: torch.nn.Module, first: torch.nn.Module | None, batch: ForwardBatch,
             dtype: torch.dtype) -> tuple:
    """What the two ways below read of a pass: the model (its device with it) and its first
    layer's (first_layer: a caller keeps it, nn.Module's attribute lookups cost more than the
    rest) fused plan, the rows, the batch's kind, whether the C kernels load; equal keys, equal
    ways (a traced step asks once per key). Plain Python values only: read cold after the pass,
    a tensor's attribute costs microseconds."""
    return (id(model), id(getattr(first, "fused", None)), dtype, batch.query_starts[-1], batch.decode_only,
            batch.use_triton, batch.static_shapes, cpu_kernels.available())


def attention_path(model: torch.nn.Module, batch: ForwardBatch, dtype: torch.dtype) -> str:
    """"triton", "c_fused", "c_kernel" or "torch" for this pass of `model` (a CausalLM) over
    `batch`, computed in `dtype`; "mla" for DeepSeek's attention (engine/layers/mla.py), which
    has one way of its own; "" when the model is not one of these."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers:
        return ""
    layer = layers[0]
    if not isinstance(layer.self_attn, Attention):
        return "mla"
    if batch.use_triton:
        return "triton" if batch.decode_only else "torch"  # a GPU's prefill: torch's SDPA over the pages
    rows = torch.empty((batch.input_ids.shape[0], 0), dtype=dtype, device=batch.input_ids.device)
    if getattr(layer, "fusable", False) and layer.fused is not None and fused.applies(rows, batch,
                                                                                       layer.fused.max_rows):
        return "c_fused"  # the plan the layer kept is the one this pass took (DecoderLayer._fused_plan)
    k_cache = layer.self_attn.k_cache
    q = torch.empty((1, layer.self_attn.num_heads, layer.self_attn.head_dim), dtype=dtype, device=k_cache.device)
    if batch.decode_only and cpu_kernels.attention_applies(q, k_cache):
        return "c_kernel"
    return "torch"


def moe_path(model: torch.nn.Module, batch: ForwardBatch, dtype: torch.dtype) -> str:
    """"moe_c_block", "moe_c" or "moe_torch" for this pass's MoE layers (the
    SparseMoE layer), by the tests its forward asks; "" for a dense model or another MoE (DeepSeek's)."""
    layers = getattr(getattr(model, "model", None), "layers", None) or ()
    layer = next((x for x in layers if type(getattr(x, "mlp", None)) is SparseMoE), None)
    if layer is None:
        return ""
    rows = torch.empty((batch.input_ids.shape[0], 0), dtype=dtype, device=batch.input_ids.device)
    if getattr(layer, "fusable", False) and layer.fused is not None and layer.fused.moe is not None \
            and fused.applies(rows, batch, layer.fused.max_rows):
        return "moe_c_block"  # the MoE half in the fused layer's C call (fused._moe_forward)
    moe = layer.mlp
    if moe.c_experts is not None and rows.device.type == "cpu" and moe.gate.blocked is not None:
        return "moe_c"
    return "moe_torch"
