"""The decode-batch tiles (engine/kernels/cpu_rows.c) against the 8-row tiles they stand in for
and the plain-torch oracle, on every build this CPU runs: this CPU's own (-march=native) and
the forced x86-64-v3 (AVX2 + F16C) and x86-64-v2 builds, each in this process (cpu.load).

They must give the 8-row tiles' bits for any number of rows up to MAX_ROWS, so that a row's
result never depends on the rows beside it; and cpu.py's table must be what each build runs."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import cpu

if not cpu.available():
    if os.environ.get("TOKENTRACE_REQUIRE_CPU_KERNELS") == "1":
        cpu.build()
        raise AssertionError("the CPU kernels built but did not load")
    pytest.skip("no C compiler for the CPU kernels", allow_module_level=True)

FLAGS = set(cpu._cpu_flags().split())
NEEDS = {"native": set(), "x86-64-v3": {"avx2", "fma", "f16c"}, "x86-64-v2": {"sse4_2"}}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(19, 37), (64, 300), (8, 16)]  # odd outputs (a part block), a tail of K, one block


def build(arch: str):
    missing = NEEDS[arch] - FLAGS
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(sorted(missing))}: it cannot run the {arch} build")
    return cpu.load(arch)


def row_tiles_apply(lib, dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16 and lib.tt_linear16_path():
        pytest.skip("bfloat16 multiplies by VDPBF16PS in this build (tiles of their own); the row tiles "
                    "widen bfloat16 by shifts: the x86-64-v3 build runs them here")


def with_row_tiles(lib, dtype: torch.dtype, rows_from: int, fn):
    kind = cpu.KINDS[dtype]
    before = lib.tt_rows_set(kind, rows_from)
    try:
        return fn()
    finally:
        lib.tt_rows_set(kind, before)


def oracle_bound(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, dtype: torch.dtype) -> None:
    """y against the products the kernels form (x as multiplied times the stored weight), summed
    in float64: float32 sums of K terms."""
    xm, wm = cpu.as_multiplied(x, dtype).double(), w.to(dtype).double()
    ref = F.linear(xm, wm, bias.double())
    scale = (xm.abs() @ wm.abs().T).max().item() + 1e-30
    assert (y.double() - ref).abs().max().item() <= scale * 4e-7 * x.shape[-1] ** 0.5


@pytest.mark.parametrize("arch", list(NEEDS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", SHAPES)
def test_row_tiles_give_the_8_row_tiles_bits(arch, dtype, n, k):
    """Every row count 1..MAX_ROWS, x strided (a row stride past K) and with a bias: the row
    tiles forced on from one row equal the 8-row tiles bit for bit, and both the oracle."""
    lib = build(arch)
    row_tiles_apply(lib, dtype)
    g = torch.Generator().manual_seed(n * 1000 + k)
    w, bias = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    wide = torch.randn(cpu.MAX_ROWS, k + 5, generator=g)
    bw = cpu.BlockedWeight.of(w, dtype)
    for rows in range(1, cpu.MAX_ROWS + 1):
        x = wide[:rows, :k]  # row stride k + 5
        tiles = with_row_tiles(lib, dtype, 1, lambda: cpu.linear(x, bw, bias, lib=lib))
        eight = with_row_tiles(lib, dtype, cpu.NEVER, lambda: cpu.linear(x, bw, bias, lib=lib))
        assert torch.equal(tiles, eight), f"{rows} rows"
        oracle_bound(tiles, x, w, bias, dtype)


@pytest.mark.parametrize("arch", list(NEEDS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_alone_equals_the_row_in_a_batch(arch, dtype):
    """With the build's own table: each row of a batch of 1..MAX_ROWS is what it gives alone
    (a sequence's tokens do not depend on the batch it decodes in)."""
    lib = build(arch)
    g = torch.Generator().manual_seed(7)
    w, x = torch.randn(70, 200, generator=g), torch.randn(cpu.MAX_ROWS, 200, generator=g)
    bw = cpu.BlockedWeight.of(w, dtype)
    alone = torch.cat([cpu.linear(x[i:i + 1], bw, lib=lib) for i in range(cpu.MAX_ROWS)])
    for rows in (2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 32):
        assert torch.equal(cpu.linear(x[:rows], bw, lib=lib), alone[:rows]), f"{rows} rows"


@pytest.mark.parametrize("arch", list(NEEDS))
def test_each_build_runs_its_row_of_the_table(arch):
    lib = build(arch)
    table = cpu.ROW_TILES_FROM[min(lib.tt_vector_bits(), 512)]
    for dtype in DTYPES:
        kind = cpu.KINDS[dtype]
        current = lib.tt_rows_set(kind, 5)
        lib.tt_rows_set(kind, current)
        assert current == table[dtype]



@pytest.mark.parametrize("arch", list(NEEDS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_prefill_chunk_takes_the_row_tiles_with_the_same_bits(arch, dtype):
    """Past MAX_ROWS, up to a prefill chunk's most rows in C (128), 16-bit weights take the row
    tiles too (each weight vector widened once for 6 rows), from the build's own threshold:
    each row what it gives alone, and what the 8-row tiles give."""
    lib = build(arch)
    row_tiles_apply(lib, dtype)
    g = torch.Generator().manual_seed(11)
    w, x = torch.randn(70, 200, generator=g), torch.randn(128, 200, generator=g)
    bw = cpu.BlockedWeight.of(w, dtype)
    alone = torch.cat([cpu.linear(x[i:i + 1], bw, lib=lib) for i in range(128)])
    for rows in (33, 37, 64, 100, 128):
        tiles = cpu.linear(x[:rows], bw, lib=lib)
        assert torch.equal(tiles, alone[:rows]), f"{rows} rows"
        eight = with_row_tiles(lib, dtype, cpu.NEVER, lambda: cpu.linear(x[:rows], bw, lib=lib))
        assert torch.equal(tiles, eight), f"{rows} rows"
