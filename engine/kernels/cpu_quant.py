"""The CPU's int8 / int4 weight-only kernels (cpu_quant.c): built like cpu_linear.c (see
cpu.py: compiled on first use, cached by content, called through ctypes), float32
activations in and out.

A weight is stored as one stream of records, each holding 8 output rows x 32 inputs:
their codes, then their scales d (and for int4 offsets m) as float32. int8: w = q * d;
int4: w = q * d + m with q in 0..15. GGUF's Q8_0, Q4_0 and Q4_1 blocks are 32 inputs of
one row with the same meaning, so their codes are copied in as they are.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.kernels import cpu

SOURCE = Path(__file__).with_name("cpu_quant.c")
GROUP = 32  # inputs per scale
ROWS_PER_BLOCK = 8


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None where the float32 ones cannot run either (switched off
    with TOKENTRACE_CPU_KERNELS=0, no compiler) or this file fails to build."""
    if cpu.library() is None:
        return None
    try:
        lib = ctypes.CDLL(str(cpu.build(source=SOURCE)))
    except (cpu.BuildError, OSError):
        return None
    c_long, ptr = ctypes.c_long, ctypes.c_void_p
    args = [ptr, c_long, c_long, ptr, c_long, c_long, ptr, ptr, c_long, ctypes.c_int]
    lib.tt_linear_q8.argtypes, lib.tt_linear_q8.restype = args, None
    lib.tt_linear_q4.argtypes, lib.tt_linear_q4.restype = args, ctypes.c_int
    lib.tt_dequantize.argtypes, lib.tt_dequantize.restype = [ptr, ctypes.c_int, c_long, c_long, ptr, ctypes.c_int], None
    return lib


def available() -> bool:
    return library() is not None


@dataclass
class BlockedQuantWeight:
    """An int8 / int4 weight [out, in] as cpu_quant.c's record stream (uint8), out padded
    to whole blocks of 8 rows with zero codes and scales."""
    kind: str  # "int8" or "int4"
    data: torch.Tensor
    out_features: int
    in_features: int

    @classmethod
    def int8(cls, q: torch.Tensor, d: torch.Tensor) -> "BlockedQuantWeight":
        """q: int8 codes [N, K]; d: float scales [N, K/32]."""
        n, k = q.shape
        codes = _blocks(q.view(torch.uint8), 0).reshape(-1, k // GROUP, ROWS_PER_BLOCK * GROUP)
        return cls("int8", _on_huge_pages(torch.cat([codes, _scales(d)], dim=-1)), n, k)

    @classmethod
    def int4(cls, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> "BlockedQuantWeight":
        """q: codes [N, K] in 0..15; d, m: float [N, K/32]."""
        n, k = q.shape
        b = _blocks(q.to(torch.uint8), 0)  # [B, K/32, 8, 32]
        packed = (b[..., :16] | (b[..., 16:] << 4)).reshape(-1, k // GROUP, ROWS_PER_BLOCK * GROUP // 2)
        return cls("int4", _on_huge_pages(torch.cat([packed, _scales(d), _scales(m)], dim=-1)), n, k)

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, in] that the records stand for."""
        lib = library()
        assert lib is not None, "dequantize() needs the CPU kernels (see available())"
        out = torch.empty(self.out_features, self.in_features, dtype=torch.float32)
        lib.tt_dequantize(self.data.data_ptr(), int(self.kind == "int4"), self.out_features, self.in_features,
                          out.data_ptr(), torch.get_num_threads())
        return out


def _on_huge_pages(records: torch.Tensor) -> torch.Tensor:
    """The records, copied where every decode step streams them from: see cpu.huge_page_empty."""
    return cpu.huge_page_empty(tuple(records.shape), records.dtype).copy_(records)


def _blocks(a: torch.Tensor, fill) -> torch.Tensor:
    """[N, C] -> [N/8, C/32, 8, 32] (N padded to whole blocks with `fill`)."""
    n, c = a.shape
    rb = ROWS_PER_BLOCK
    padded = torch.full((-(-n // rb) * rb, c), fill, dtype=a.dtype)
    padded[:n] = a
    return padded.view(-1, rb, c // GROUP, GROUP).permute(0, 2, 1, 3)


def _scales(s: torch.Tensor) -> torch.Tensor:
    """[N, K/32] float -> the 8 rows' float32 values of each record as bytes: [N/8, K/32, 32]."""
    n, g = s.shape
    rb = ROWS_PER_BLOCK
    padded = torch.zeros(-(-n // rb) * rb, g, dtype=torch.float32)
    padded[:n] = s
    return padded.view(-1, rb, g).permute(0, 2, 1).contiguous().view(torch.uint8)


def linear(x: torch.Tensor, w: BlockedQuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] (float32) @ W.T (+ bias) -> [..., out] float32, W the dequantized weight.
    Over cpu.MAX_ROWS rows (a prefill chunk: compute-bound) the weight is dequantized for
    this call and PyTorch's GEMM does the product. Lean: a decode step calls it per layer."""
    lib = library()
    assert lib is not None, "linear() needs the CPU kernels (see available())"
    x2 = x if x.dim() == 2 else x.reshape(-1, w.in_features)
    if x2.shape[0] > cpu.MAX_ROWS:
        y = F.linear(x2.float(), w.dequantize(), None if bias is None else bias.float())
        return y if x.dim() == 2 else y.view(*x.shape[:-1], w.out_features)
    x2, bias, y = cpu.operands(x2, bias, w.out_features)
    T = x2.shape[0]
    if T:
        fn = lib.tt_linear_q8 if w.kind == "int8" else lib.tt_linear_q4
        rc = fn(x2.data_ptr(), T, x2.stride(0), w.data.data_ptr(), w.out_features, w.in_features,
                None if bias is None else bias.data_ptr(), y.data_ptr(), w.out_features, torch.get_num_threads())
        if rc:  # int4's group sums of x could not be allocated
            raise MemoryError(f"cpu_quant: no memory for {T} x {w.in_features // GROUP} group sums")
    return y if x.dim() == 2 else y.view(*x.shape[:-1], w.out_features)
