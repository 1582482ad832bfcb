"""Weight-only quantized linear layers for the CPU: int8 per output channel, int4 in
groups of 32 along the input, both kept packed and multiplied by PyTorch's CPU
weight-only kernels (as gpt-fast does).

On this project's CPU (AVX-512 with bf16) the kernels are fast only with bfloat16
activations and scales: float32 inputs take a scalar path 10-30x slower than the float
matmul. So a quantized layer rounds its input to bfloat16, and its scales are stored in
bfloat16; the result is returned in the input's dtype. That rounding is part of what the
bench's agreement rows measure against float32.

int4 codes q in 0..15 stand for (q - 8) * scale + zero, one (scale, zero) per 32 inputs of
a row. GGUF's Q4_0 (q - 8) * d and Q4_1 q * d + m blocks are 32 inputs too, so their codes
are used as they are (scale = d, zero = m + 8d; only d and m are rounded from float16 to
bfloat16); see engine/gguf_loader.py `q4_codes`. Everything else is quantized at load
from the float weight: int4 by each group's min/max, int8 by each row's largest magnitude.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

QUANTIZATIONS = ("int8", "int4")
GROUP = 32  # inputs per int4 scale: GGUF's Q4 block size
_KERNEL_DTYPE = torch.bfloat16


@dataclass
class QuantizedWeight:
    kind: str  # "int8" or "int4"
    data: torch.Tensor  # int8 [N, K], or int4 codes packed by the kernel's converter (uint8 [N, K/2])
    scales: torch.Tensor  # int8: [N]; int4: [K/GROUP, N, 2] (scale, zero), bfloat16
    shape: tuple[int, int]  # [N, K] of the float weight
    source: str  # where the codes came from: "GGUF Q4_1", "GGUF Q4_0" or "quantized at load"

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] @ W.T (+ bias), W the dequantized weight."""
        lead, xk = x.shape[:-1], x.reshape(-1, x.shape[-1]).to(_KERNEL_DTYPE)
        if self.kind == "int8":
            y = torch.ops.aten._weight_int8pack_mm(xk, self.data, self.scales)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(xk, self.data, GROUP, self.scales)
        y = y.to(x.dtype).reshape(*lead, self.shape[0])
        return y + bias if bias is not None else y

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scales.numel() * self.scales.element_size()


def check_quantization(kind: str | None) -> str | None:
    if kind in (None, "", "none"):
        return None
    if kind not in QUANTIZATIONS:
        raise ValueError(f"unsupported quantization {kind!r}; choose one of {', '.join(QUANTIZATIONS)} (or none)")
    return kind


def can_quantize(kind: str, shape: tuple[int, ...], device: torch.device) -> bool:
    """Whether the CPU kernels take this [N, K] weight: int4 needs N % 16 and K % 32."""
    if device.type != "cpu" or len(shape) != 2:
        return False
    n, k = shape
    return kind == "int8" or (n % 16 == 0 and k % GROUP == 0)


def quantize_int8(w: torch.Tensor) -> QuantizedWeight:
    """Symmetric int8, one scale per output row (the row's largest magnitude / 127)."""
    w = w.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(_KERNEL_DTYPE)
    q = torch.round(w / scales.float()[:, None]).clamp(-128, 127).to(torch.int8)
    return QuantizedWeight("int8", q.contiguous(), scales, tuple(w.shape), "quantized at load")


def quantize_int4(w: torch.Tensor) -> QuantizedWeight:
    """Asymmetric int4 in groups of GROUP inputs: each group's [min, max] in 16 steps."""
    w = w.detach().float()
    n, k = w.shape
    g = w.view(n, k // GROUP, GROUP)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scale = ((hi - lo) / 15).clamp(min=1e-8).to(_KERNEL_DTYPE).float()
    zero = (lo + 8 * scale).to(_KERNEL_DTYPE).float()  # stored rounded: codes chosen against what is stored
    codes = torch.round((g - (zero - 8 * scale)[..., None]) / scale[..., None]).clamp(0, 15)
    return int4_from_codes(codes.view(n, k).to(torch.uint8), scale, zero, "quantized at load")


def int4_from_codes(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, source: str) -> QuantizedWeight:
    """codes [N, K] in 0..15 and per-group scale/zero [N, K/GROUP]: w = (q - 8) * scale + zero."""
    n, k = codes.shape
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
    scales = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(_KERNEL_DTYPE)  # [K/G, N, 2]
    return QuantizedWeight("int4", packed, scales, (n, k), source)


def dequantize_codes(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """The float weight that int4 codes stand for (a plain-torch reference)."""
    n, k = codes.shape
    g = codes.view(n, k // GROUP, GROUP).float() - 8
    return (g * scale[..., None].float() + zero[..., None].float()).view(n, k)
