"""The CPU's int8 / int4 kernels (engine/kernels/cpu_quant.c) against plain torch:
dequantize the codes (q * d, q * d + m per group of 32), then F.linear in float64.

They need a C compiler; without one they skip, unless TOKENTRACE_REQUIRE_CPU_KERNELS=1
(set by .ci/run), where a kernel that cannot build fails instead."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import cpu, cpu_quant
from engine.layers.quantized import dequantize_codes

if not cpu_quant.available():
    if os.environ.get("TOKENTRACE_REQUIRE_CPU_KERNELS") == "1":
        cpu.build(source=cpu_quant.SOURCE)  # raises with the compiler's message
        raise AssertionError("the CPU kernels built but did not load")
    pytest.skip("no C compiler for the CPU kernels", allow_module_level=True)


def random_weight(kind: str, n: int, k: int, g: torch.Generator):
    """Codes and per-group scales (and offsets) like real ones: d ~ 1/sqrt(k) / code range,
    float16 values as in a GGUF block."""
    d = ((torch.rand(n, k // 32, generator=g) + 0.5) / k ** 0.5 / (64 if kind == "int8" else 8)).half().float()
    if kind == "int8":
        q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
        return (q, d), cpu_quant.BlockedQuantWeight.int8(q, d), dequantize_codes(q, d)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    m = (-8 * d + torch.randn(n, k // 32, generator=g) * d).half().float()  # Q4_0-like, off centre
    return (q, d, m), cpu_quant.BlockedQuantWeight.int4(q, d, m), dequantize_codes(q, d, m)


def check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    """y against the float64 product: float32 sums of k terms in another order (and int4's
    offsets summed apart) are ~sqrt(k) ulps of the terms' magnitude off."""
    ref = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    scale = (x.double().abs() @ w.double().abs().T).max().item()
    assert y.dtype == torch.float32 and y.shape == ref.shape
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-6 * x.shape[-1] ** 0.5 * scale)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("n,k", [(8, 32), (13, 64), (577, 576), (130, 1536)])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 32, 33])
def test_linear_matches_dequantized_reference(kind, n, k, rows):
    g = torch.Generator().manual_seed(n * 1000 + k + rows)
    _, bw, w = random_weight(kind, n, k, g)
    x, bias = torch.randn(rows, k, generator=g), torch.randn(n, generator=g)
    check(cpu_quant.linear(x, bw), x, w)
    check(cpu_quant.linear(x, bw, bias), x, w, bias)  # 33 rows: the dequantized weight and PyTorch's GEMM


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_many_rows_in_the_kernel(kind, monkeypatch):
    """Rows above MAX_ROWS go to the dequantized GEMM; the tiles take any number too."""
    monkeypatch.setattr(cpu, "MAX_ROWS", 1 << 20)
    g = torch.Generator().manual_seed(5)
    _, bw, w = random_weight(kind, 40, 96, g)
    x = torch.randn(37, 96, generator=g)
    check(cpu_quant.linear(x, bw), x, w)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("threads", [1, 2])
def test_large_matrix_split_between_threads(kind, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(threads)
        _, bw, w = random_weight(kind, 4099, 320, g)
        for rows in (1, 5):
            x = torch.randn(rows, 320, generator=g)
            check(cpu_quant.linear(x, bw), x, w)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_dequantize_is_exact(kind):
    """The kernel's copy of the weight (used for prefill) is the reference's, bit for bit:
    q * d (+ m) rounds once in both, the product being exact (codes of 4-8 bits)."""
    g = torch.Generator().manual_seed(7)
    _, bw, w = random_weight(kind, 21, 128, g)
    torch.testing.assert_close(bw.dequantize(), w, rtol=0, atol=0)


def test_record_layout():
    """One record per 8 rows x 32 inputs: the codes (int4: byte j holds inputs j and j + 16),
    then d (and m) as float32."""
    n, k = 10, 64
    q4 = (torch.arange(n * k) % 16).to(torch.uint8).view(n, k)
    d, m = torch.arange(n * 2, dtype=torch.float32).view(n, 2) + 1, -torch.arange(n * 2, dtype=torch.float32).view(n, 2)
    bw = cpu_quant.BlockedQuantWeight.int4(q4, d, m)
    assert bw.data.shape == (2, 2, 8 * 16 + 2 * 8 * 4)  # 10 rows -> 2 blocks, 64 inputs -> 2 groups
    rec = bw.data[0, 1]  # rows 0-7, inputs 32-63
    byte = rec[3 * 16 + 2].item()  # row 3, inputs 32 + 2 and 32 + 18
    assert byte & 15 == q4[3, 34].item() and byte >> 4 == q4[3, 50].item()
    assert rec[128:160].view(torch.float32)[3].item() == d[3, 1].item()
    assert rec[160:192].view(torch.float32)[3].item() == m[3, 1].item()
    assert bw.data[1, 0, 2 * 16:128].sum() == 0 and bw.data[1, 0, 128 + 2 * 4:160].sum() == 0  # padding rows
    q8 = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    bw8 = cpu_quant.BlockedQuantWeight.int8(q8, d)
    assert bw8.data.shape == (2, 2, 8 * 32 + 8 * 4)
    assert bw8.data[1, 1, 32 + 5].view(torch.int8).item() == q8[9, 37].item()
    assert bw8.data[1, 1, 256:288].view(torch.float32)[1].item() == d[9, 1].item()


def test_strided_batched_and_empty_inputs():
    g = torch.Generator().manual_seed(9)
    _, bw, w = random_weight("int4", 24, 64, g)
    wide = torch.randn(6, 100, generator=g)
    check(cpu_quant.linear(wide[:, 10:74], bw), wide[:, 10:74], w)  # rows 100 floats apart
    x3 = torch.randn(2, 3, 64, generator=g)
    assert cpu_quant.linear(x3, bw).shape == (2, 3, 24)
    check(cpu_quant.linear(x3, bw).view(6, 24), x3.view(6, 64), w)
    assert cpu_quant.linear(torch.randn(0, 64), bw).shape == (0, 24)


def test_built_beside_the_float_kernel(tmp_path):
    lib = cpu.build(tmp_path, source=cpu_quant.SOURCE)
    assert lib.name.startswith("cpu_quant-") and cpu.build(tmp_path, source=cpu_quant.SOURCE) == lib
    assert cpu.build(tmp_path).name.startswith("tokentrace_cpu-")  # the float kernels' own file
