"""The bfloat16 prefill GEMM on AMX sets nothing process-wide: a float32 matmul that another
thread runs while it is under way stays float32, bit for bit. (The earlier path set oneDNN's
fp32_precision to bf16 for the process around its call; a second served model's float32
matmul at that moment ran on bfloat16 operands.)

No race: a torch-function mode, which is the GEMM thread's own, stops that thread at every
torch call inside prefill_gemm.gemm and runs the other thread's matmul to its end right there."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from engine.kernels import cpu, cpu_amx
from engine.layers import prefill_gemm

pytestmark = pytest.mark.skipif(not (cpu.available() and cpu.amx_bf16()),
                                reason="the AMX bfloat16 GEMM needs the C kernels and a CPU with AMX bfloat16")


class EveryCallRunsTheOtherThread(TorchFunctionMode):
    """At each torch call of the thread that entered it, first runs `beside` in another
    thread and waits for it to end."""

    def __init__(self, beside) -> None:
        super().__init__()
        self.beside, self.stops = beside, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        other = threading.Thread(target=self.beside)
        other.start()
        other.join()
        self.stops += 1
        return func(*args, **(kwargs or {}))


def test_a_float32_matmul_beside_the_bf16_prefill_stays_float32():
    torch.manual_seed(0)
    w = torch.randn(1536, 576)
    blocked = cpu.BlockedWeight.of(w, torch.bfloat16)
    x = torch.randn(cpu.kernel_rows(torch.bfloat16) + 37, 576)
    a, b = torch.randn(64, 576), torch.randn(1536, 576)
    expected = F.linear(a, b)  # float32, before anything else ran
    seen: list[torch.Tensor] = []
    mode = EveryCallRunsTheOtherThread(lambda: seen.append(F.linear(a, b)))
    assert prefill_gemm.bf16_tiles(blocked, 0) and cpu_amx.available()
    with mode:
        y = prefill_gemm.gemm(x, blocked)
    assert mode.stops > 0 and len(seen) == mode.stops
    assert all(torch.equal(s, expected) for s in seen), "a float32 matmul ran in bfloat16 beside the prefill"
    assert torch.backends.mkldnn.matmul.fp32_precision == "none"
    with torch.backends.mkldnn.flags(enabled=True, fp32_precision="bf16"):  # the tiles' sums: oneDNN's bits
        oracle = F.linear(cpu.as_multiplied(x, torch.bfloat16), w.bfloat16().float())
    assert torch.equal(y, oracle)


def test_the_tiles_against_plain_torch_at_odd_shapes():
    """Rows, columns and inputs that fill no whole tile: padded, cut back, the bias added."""
    torch.manual_seed(1)
    for m, n, k in ((17, 40, 50), (33, 8, 96), (100, 200, 576)):
        w, x, bias = torch.randn(n, k), torch.randn(m, k).bfloat16().float(), torch.randn(n)
        y = cpu_amx.gemm_bf16(x.view(1, m, k), cpu.BlockedWeight.of(w, torch.bfloat16), bias)
        expected = x.double() @ w.bfloat16().double().T + bias.double()
        assert y.shape == (1, m, n) and y.dtype == torch.float32
        torch.testing.assert_close(y[0].double(), expected, rtol=0, atol=1e-5 * k ** 0.5)
