"""The bfloat16 prefill GEMM on the AMX tiles (cpu_amx.c), built like the other kernels (cpu.py:
on first use, cached by content, called through ctypes, which releases the GIL).

It takes bfloat16 operands and gives float32 sums with no process-wide setting: the earlier
path asked oneDNN for bfloat16 products through torch.backends.mkldnn.matmul.fp32_precision,
which is global, so another thread's float32 matmul at that moment ran in bfloat16 too.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from engine.kernels import cpu

SOURCE = Path(__file__).with_name("cpu_amx.c")
ROWS = 16  # a tile's rows: x is padded to a multiple


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernel, or None where it cannot run: no AMX bfloat16 on this CPU (or
    ONEDNN_MAX_CPU_ISA rules it out, see cpu.amx_bf16), no float kernels, a failed build, or
    Linux refusing the tiles' state."""
    if cpu.library() is None or not cpu.amx_bf16():
        return None
    try:
        lib = ctypes.CDLL(str(cpu.build(source=SOURCE, arch="native")))
    except (cpu.BuildError, OSError):
        return None
    c_long, ptr = ctypes.c_long, ctypes.c_void_p
    lib.tt_amx_init.argtypes, lib.tt_amx_init.restype = [], ctypes.c_int
    lib.tt_amx_bf16_gemm.argtypes = [ptr, c_long, ptr, c_long, c_long, ptr, ctypes.c_int]
    lib.tt_amx_bf16_gemm.restype = ctypes.c_int
    return lib if lib.tt_amx_init() == 0 else None


def available() -> bool:
    return library() is not None


def gemm_bf16(x: torch.Tensor, w: cpu.BlockedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] rounded to bfloat16 (nearest even, as cpu.as_multiplied rounds it) @ W.T
    (+ bias) -> [..., out] float32, W bfloat16 blocked. The products are exact, the sums float32
    (their order is the tiles', not the C kernel's)."""
    lib = library()
    assert lib is not None and w.dtype == torch.bfloat16, "gemm_bf16 needs AMX and a bfloat16 weight"
    lead = x.shape[:-1]
    x2 = x.reshape(-1, w.in_features)
    M, (nb, kb) = x2.shape[0], w.data.shape[:2]
    m_pad, k_pad, n_pad = -(-M // ROWS) * ROWS, kb * 32, -(-nb // 2) * 16
    xb = torch.empty(m_pad, k_pad, dtype=torch.bfloat16)
    xb[:M, :w.in_features].copy_(x2)
    xb[M:].zero_()
    xb[:M, w.in_features:].zero_()
    y = torch.empty(m_pad, n_pad, dtype=torch.float32)
    if lib.tt_amx_bf16_gemm(xb.data_ptr(), m_pad, w.data.data_ptr(), nb, kb, y.data_ptr(),
                            torch.get_num_threads()):
        raise MemoryError("cpu_amx.c: no memory to pack the weight")
    y = y[:M] if n_pad == w.out_features else y[:M, :w.out_features].contiguous()
    if bias is not None:
        y.add_(bias.float())
    return y.view(*lead, w.out_features)
