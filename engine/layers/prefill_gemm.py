"""A prefill chunk's matmul on a blocked weight: past kernels.cpu.kernel_rows rows of x the
C kernel's one-row design loses to a GEMM, which needs the weight row-major. The blocked copy
is the layer's only one (keeping a second would double the weights' memory), so each call
widens it back, in one strided copy straight to float32 (a copy per matrix per pass: at 37
rows about as long as the GEMM itself, at 512 rows a tenth of it).

bfloat16 weights on a CPU with AMX: the GEMM runs on the AMX tiles in our own kernel
(kernels.cpu_amx), bfloat16 operands in, float32 sums out. Both operands are bfloat16 values
already (the weight is stored so, x is rounded as every bfloat16 path rounds it,
kernels.cpu.as_multiplied), so the products are the C kernel's, summed in float32: only the
order of the sums differs (the tiles' order, bit for bit oneDNN's). It reads the blocked copy
directly and sets nothing process-wide: oneDNN's bfloat16 products for float32 tensors are
reached only through torch.backends.mkldnn.matmul.fp32_precision, global to the process, which
would send another thread's float32 matmul to bfloat16 while set.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels import cpu as cpu_kernels
from engine.kernels import cpu_amx


def widened(w: cpu_kernels.BlockedWeight) -> torch.Tensor:
    """The weight [out, in] as float32, row-major, read back from its blocked copy in one
    copy (unblocked().float() makes two at 16 bits)."""
    d = w.data
    nb, kb, rb, cb = d.shape
    out = torch.empty(nb, rb, kb, cb, dtype=torch.float32)
    out.copy_(d.permute(0, 2, 1, 3))
    full = out.view(nb * rb, kb * cb)
    if full.shape == (w.out_features, w.in_features):
        return full
    return full[:w.out_features, :w.in_features].contiguous()  # padded to whole blocks: cut


def bf16_tiles(w: cpu_kernels.BlockedWeight, exact_rows: int) -> bool:
    """Whether this call's products go to the AMX tiles: bfloat16 weights, a CPU with them,
    and no logit-lens rows (those keep x's 16 mantissa bits, which bfloat16 operands lose)."""
    return w.dtype == torch.bfloat16 and exact_rows <= 0 and cpu_amx.available()


def gemm(x: torch.Tensor, w: cpu_kernels.BlockedWeight, bias: torch.Tensor | None = None,
         exact_rows: int = 0) -> torch.Tensor:
    """x [..., in] @ W.T (+ bias) -> [..., out] float32 by PyTorch's GEMM on the widened copy,
    x rounded as the kernels for W's dtype round it (kernels.cpu.as_multiplied)."""
    bias = None if bias is None else bias.float()
    if bf16_tiles(w, exact_rows):  # x rounded as as_multiplied rounds it, straight into bfloat16
        return cpu_amx.gemm_bf16(x, w, bias)
    return F.linear(cpu_kernels.as_multiplied(x, w.dtype, exact_rows), widened(w), bias)
