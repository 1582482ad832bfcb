"""Linear layers with the CPU's fast paths for float32 weights.

A decode step reads every weight once, so on a CPU its speed is how fast the matmuls
stream weights from memory. PyTorch's default float32 matmul (MKL's sgemm) streams
them well below the memory bandwidth, and at a few rows (a decode batch of 2-16
sequences) far below it. Two faster paths, each reading a copy of the weight reordered
once into a blocked layout:

- this project's C kernel (engine/kernels/cpu_linear.c), where it builds: at one row it
  streams SmolLM2's matrices at about the machine's read bandwidth (2 threads: ~36 of
  ~37 GB/s, against ~22 for oneDNN). Used up to kernels.cpu.MAX_ROWS rows; a larger
  batch (a prefill chunk) is a compute-bound GEMM, left to PyTorch's sgemm.
- otherwise oneDNN's kernels: 1.2x (1 thread) to 1.6x (2 threads) MKL's speed at one
  row and 1.9x to 2.8x at eight. Their fixed cost per call (~12 us) outweighs that for
  small matrices, which sit in the cache anyway, so only weights of at least
  PACK_MIN_BYTES are reordered.

The plain weight stays the parameter: loading, tying and reading it are unchanged; the
reordered copy costs its size again in memory (SmolLM2: +0.5 GB).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import cpu as cpu_kernels

if TYPE_CHECKING:
    from engine.layers.quantized import QuantizedWeight

PACK_MIN_BYTES = 1 << 20
PACK_ROWS = 16  # the row count oneDNN tunes the layout for; it serves 1 to hundreds of rows well


def pack_weight(w: torch.Tensor, min_bytes: int | None = None) -> torch.Tensor | None:
    """w [out, in] reordered for oneDNN's matmul, or None where that does not pay: off the
    CPU, other dtypes, or under `min_bytes` (default PACK_MIN_BYTES)."""
    min_bytes = PACK_MIN_BYTES if min_bytes is None else min_bytes
    if w.device.type != "cpu" or w.dtype != torch.float32 or not torch.backends.mkldnn.is_available() \
            or w.numel() * w.element_size() < min_bytes:
        return None
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in] @ W.T (+ bias) with W from pack_weight."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class Linear(nn.Linear):
    blocked: cpu_kernels.BlockedWeight | None = None  # the weight in the C kernel's layout, once `pack`ed
    packed: torch.Tensor | None = None  # the weight in oneDNN's layout, once `pack`ed (no C kernel)
    qweight: "QuantizedWeight | None" = None  # int8/int4 codes, once `quantize`d (engine/checkpoint/quantize.py)

    def pack(self, on: bool = True) -> None:
        on = on and self.qweight is None and self.weight is not None
        self.blocked = cpu_kernels.blocked_weight(self.weight) if on else None
        self.packed = pack_weight(self.weight) if on and self.blocked is None else None

    def quantize(self, qw: "QuantizedWeight", drop_float: bool) -> None:
        """Run on the packed codes from now on. drop_float: free the float weight (not when
        another module shares it, as a tied LM head shares the embedding)."""
        self.qweight, self.packed, self.blocked = qw, None, None
        # buffers, so the module's byte counts (bench, page) see the codes and scales
        self.register_buffer("qdata", qw.data, persistent=False)
        self.register_buffer("qscales", qw.scales, persistent=False)
        if drop_float:
            self.weight = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.qweight is not None:
            return self.qweight.linear(x, self.bias)
        if self.blocked is not None and x.numel() <= cpu_kernels.MAX_ROWS * x.shape[-1]:
            return cpu_kernels.linear(x, self.blocked, self.bias)
        if self.packed is not None:
            return packed_linear(x, self.packed, self.bias)
        return F.linear(x, self.weight, self.bias)


def pack_weights(model: nn.Module, on: bool = True) -> None:
    """Reorder the float32 CPU weights for the C kernel (or, without it, the large ones for
    oneDNN), in every module that can (after the weights are loaded: the copies do not
    follow later changes to the parameters). on=False: back to PyTorch's default matmul
    on the parameters, the copies freed."""
    for m in model.modules():
        if m is not model and hasattr(m, "pack"):
            m.pack(on)
