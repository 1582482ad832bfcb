"""Weight-only quantized linear layers for the CPU: int8 and int4 codes in groups of 32
inputs of a row, kept packed, float32 activations.

    int8: w = q * d        q in -128..127, one scale d per group: GGUF's Q8_0 exactly
    int4: w = q * d + m    q in 0..15, a scale and an offset per group: GGUF's Q4_1
                           exactly, and Q4_0's (q - 8) * d with m = -8d

A GGUF file's Q8_0 / Q4_0 / Q4_1 blocks are 32 inputs of a row too, so their codes are
used as they are (engine/checkpoint/gguf.py `block_codes`); everything else is quantized at
load from the float weight: int8 by each group's largest magnitude, int4 by each group's
min/max.

Where the project's C kernels build (engine/kernels/cpu_quant.c) the codes are stored in
their record stream and multiplied there, inputs and results in float32. Otherwise
PyTorch's CPU weight-only kernels run them (as gpt-fast does), which are fast on this CPU
only with bfloat16 activations and scales (float32 inputs take a scalar path 10-30x
slower than the float matmul), so there a layer rounds its input, its scales and its
result to bfloat16; and their int8 kernel takes one scale per row, so int8 is quantized
per row instead of per group (a Q8_0 file's codes are then requantized).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kernels import cpu_quant

GROUP = 32  # inputs per scale: GGUF's block size
_TORCH_DTYPE = torch.bfloat16  # PyTorch's kernels: activations and scales


def c_kernels() -> bool:
    """Whether int8 / int4 layers run in the C kernels (else PyTorch's)."""
    return cpu_quant.available()


@dataclass
class QuantizedWeight:
    kind: str  # "int8" or "int4"
    # C kernels: the record stream (uint8). PyTorch: int8 [N, K], or int4 codes packed by its converter
    data: torch.Tensor
    scales: torch.Tensor  # C kernels: empty (in the records); PyTorch int8: [N], int4: [K/GROUP, N, 2] bfloat16
    shape: tuple[int, int]  # [N, K] of the float weight
    source: str  # where the codes came from: "GGUF Q8_0" / "GGUF Q4_1" / "GGUF Q4_0" or "quantized at load"
    blocked: cpu_quant.BlockedQuantWeight | None = None  # the C kernels' weight (data is its stream)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] @ W.T (+ bias), W the dequantized weight."""
        if self.blocked is not None:
            return cpu_quant.linear(x, self.blocked, bias).to(x.dtype)
        lead, xk = x.shape[:-1], x.reshape(-1, x.shape[-1]).to(_TORCH_DTYPE)
        if self.kind == "int8":
            y = torch.ops.aten._weight_int8pack_mm(xk, self.data, self.scales)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(xk, self.data, GROUP, self.scales)
        y = y.to(x.dtype).reshape(*lead, self.shape[0])
        return y + bias if bias is not None else y

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scales.numel() * self.scales.element_size()


def can_quantize(kind: str, shape: tuple[int, ...], device: torch.device) -> bool:
    """Whether the kernels take this [N, K] weight: K in whole groups (PyTorch's int4: N % 16 too)."""
    if device.type != "cpu" or len(shape) != 2:
        return False
    n, k = shape
    if not c_kernels():
        return kind == "int8" or (n % 16 == 0 and k % GROUP == 0)
    return k % GROUP == 0


def file_types(kind: str) -> tuple[str, ...]:
    """The GGUF block types whose codes a `kind` layer takes as they are."""
    if kind == "int4":
        return ("Q4_0", "Q4_1")
    return ("Q8_0",) if c_kernels() else ()  # PyTorch's int8 kernel has one scale per row


def quantize_int8(w: torch.Tensor) -> QuantizedWeight:
    """Symmetric int8: each group's largest magnitude / 127 (PyTorch's kernels: each row's)."""
    w = w.detach().float()
    n, k = w.shape
    if not c_kernels():
        scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(_TORCH_DTYPE)
        q = torch.round(w / scales.float()[:, None]).clamp(-128, 127).to(torch.int8)
        return QuantizedWeight("int8", q.contiguous(), scales, (n, k), "quantized at load")
    g = w.view(n, k // GROUP, GROUP)
    d = (g.abs().amax(dim=-1) / 127).clamp(min=1e-12)
    q = torch.round(g / d[..., None]).clamp(-128, 127).to(torch.int8).view(n, k)
    return int8_from_codes(q, d, "quantized at load")


def quantize_int4(w: torch.Tensor) -> QuantizedWeight:
    """Asymmetric int4 in groups of GROUP inputs: each group's [min, max] in 16 steps."""
    w = w.detach().float()
    n, k = w.shape
    g = w.view(n, k // GROUP, GROUP)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    d, m = ((hi - lo) / 15).clamp(min=1e-8), lo
    if not c_kernels():  # codes chosen against what PyTorch's kernels store: d and m + 8d in bfloat16
        d = d.to(_TORCH_DTYPE).float()
        m = (m + 8 * d).to(_TORCH_DTYPE).float() - 8 * d
    codes = torch.round((g - m[..., None]) / d[..., None]).clamp(0, 15)
    return int4_from_codes(codes.view(n, k).to(torch.uint8), d, m, "quantized at load")


def int8_from_codes(q: torch.Tensor, d: torch.Tensor, source: str) -> QuantizedWeight:
    """int8 codes [N, K] and per-group scales [N, K/GROUP]: w = q * d (C kernels only)."""
    assert c_kernels(), "grouped int8 runs in the C kernels only"
    blocked = cpu_quant.BlockedQuantWeight.int8(q, d.float())
    return QuantizedWeight("int8", blocked.data, torch.empty(0), tuple(q.shape), source, blocked)


def int4_from_codes(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor, source: str) -> QuantizedWeight:
    """codes [N, K] in 0..15 and per-group d, m [N, K/GROUP]: w = q * d + m."""
    n, k = codes.shape
    if c_kernels():
        blocked = cpu_quant.BlockedQuantWeight.int4(codes, d.float(), m.float())
        return QuantizedWeight("int4", blocked.data, torch.empty(0), (n, k), source, blocked)
    # PyTorch's kernel: w = (q - 8) * scale + zero, so scale = d, zero = m + 8d
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
    scales = torch.stack([d, m + 8 * d], dim=-1).transpose(0, 1).contiguous().to(_TORCH_DTYPE)  # [K/G, N, 2]
    return QuantizedWeight("int4", packed, scales, (n, k), source)


def dequantize_codes(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
    """The float weight that codes [N, K] with per-group d (and m) stand for: q * d (+ m). A
    plain-torch reference."""
    n, k = codes.shape
    w = codes.view(n, k // GROUP, GROUP).float() * d[..., None].float()
    if m is not None:
        w = w + m[..., None].float()
    return w.view(n, k)
