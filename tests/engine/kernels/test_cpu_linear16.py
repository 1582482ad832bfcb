"""The 16-bit weight kernels (engine/kernels/cpu_linear16.c) against plain torch: the
activations as the kernel multiplies them (rounded to bfloat16 against bfloat16 weights,
float32 against float16) times the 16-bit weight, summed in float64 as the oracle.

Every path is built here: this CPU's own (-march=native: AVX-512 BF16's dot products where
it has them) and the forced fallbacks x86-64-v3 (AVX2 + F16C, no AVX-512: widening by shifts
and VCVTPH2PS) and x86-64-v2 (neither: float16 by bit arithmetic), each where this CPU can
run it."""
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

FLAGS = cpu._cpu_flags().split()
ARCHES = ["native"] + [a for a, needs in (("x86-64-v3", {"avx2", "fma", "f16c"}), ("x86-64-v2", {"sse4_2"}))
                       if needs <= set(FLAGS)]
DTYPES = [torch.bfloat16, torch.float16]


def check(y: torch.Tensor, x: torch.Tensor, w16: torch.Tensor, bias: torch.Tensor | None, lib) -> None:
    """y against the products the kernel is meant to form, summed in float64: x as it is
    multiplied (rounded to bfloat16 against bfloat16 weights on every path, float32 against
    float16) times the 16-bit weight. The bound: float32 sums of K terms."""
    xm = cpu.as_multiplied(x, w16.dtype).double()
    ref = F.linear(xm, w16.double(), None if bias is None else bias.double())
    k = x.shape[-1]
    scale = (xm.abs() @ w16.double().abs().T).max().item() + 1e-30
    assert (y.double() - ref).abs().max().item() <= scale * 4e-7 * k ** 0.5


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(8, 32), (576, 576), (577, 576), (10, 37), (3, 5), (130, 1536)])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 33])
def test_linear16_matches_torch(arch, dtype, n, k, rows):
    lib = cpu.load(arch)
    g = torch.Generator().manual_seed(n * 1000 + k + rows)
    w, x, bias = torch.randn(n, k, generator=g), torch.randn(rows, k, generator=g), torch.randn(n, generator=g)
    bw = cpu.BlockedWeight.of(w, dtype)
    assert bw.dtype == dtype and bw.nbytes == bw.data.numel() * 2
    w16 = w.to(dtype)
    check(cpu.linear(x, bw, lib=lib), x, w16, None, lib)
    check(cpu.linear(x, bw, bias, lib=lib), x, w16, bias, lib)


def test_each_arch_takes_its_path():
    """The native build on a CPU with AVX-512 BF16 takes the dot products; a build without
    it widens by shifts (so both are tested on such a CPU)."""
    assert cpu.load("native").tt_linear16_path() == int("avx512_bf16" in FLAGS)
    for arch in ARCHES[1:]:
        assert cpu.load(arch).tt_linear16_path() == 0


@pytest.mark.parametrize("arch", ARCHES)
def test_float16_special_values_widen_exactly(arch):
    """Subnormals, the largest value, infinities and signed zeros: a one-column weight times 1
    is the weight itself, widened."""
    lib = cpu.load(arch)
    values = torch.tensor([0.0, -0.0, 6.0e-8, -6.0e-8, 3.0e-5, 1.0, -2.5, 65504.0, float("inf"), float("-inf")],
                          dtype=torch.float16)
    bw = cpu.BlockedWeight.of(values.view(-1, 1), torch.float16)
    y = cpu.linear(torch.ones(1, 1), bw, lib=lib)[0]
    assert torch.equal(y, values.float())
    nan = cpu.linear(torch.ones(1, 1), cpu.BlockedWeight.of(torch.tensor([[float("nan")]]), torch.float16), lib=lib)
    assert nan.isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(10, 20), (8, 32), (1, 1), (33, 577)])
def test_blocking_reads_back(dtype, n, k):
    """The 16-bit layout (32 columns to a block row) in C equals torch's, and reads back:
    whole (unblocked) and by rows (an embedding's lookup of a tied head)."""
    w = torch.randn(n, k)
    bw = cpu.BlockedWeight.of(w, dtype)
    assert bw.data.shape == (-(-n // 8), -(-k // 32), 8, 32)
    assert torch.equal(bw.data, cpu.block_reference(w.to(dtype)))
    assert torch.equal(bw.unblocked(), w.to(dtype))
    ids = torch.tensor([[0, n - 1], [n // 2, 0]])
    assert torch.equal(bw.rows(ids), w.to(dtype).float()[ids])


def test_float32_blocked_reads_back():
    w = torch.randn(19, 37)
    bw = cpu.BlockedWeight.of(w)
    assert torch.equal(bw.unblocked(), w) and torch.equal(bw.rows(torch.tensor([18, 3])), w[[18, 3]])


def test_large_matrix_split_between_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        w, x = torch.randn(4099, 300), torch.randn(5, 300)
        for dtype in DTYPES:
            lib = cpu.library()
            check(cpu.linear(x, cpu.BlockedWeight.of(w, dtype)), x, w.to(dtype), None, lib)
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif("x86-64-v3" not in ARCHES, reason="this CPU cannot run an AVX2 build")
def test_engine_on_the_avx2_build_gives_the_native_builds_tokens():
    """The whole engine at bfloat16 and float16 with every kernel built for x86-64-v3 (no
    AVX-512: the path a CI machine with AVX2 only takes), in a fresh process: its greedy
    tokens equal this process's native build's."""
    import json
    import subprocess
    import sys

    from engine.llm import LLM
    from engine.sampling_params import SamplingParams
    script = ("import json, sys\nfrom engine.llm import LLM\nfrom engine.sampling_params import SamplingParams\n"
              "from engine.kernels import cpu\n"
              "assert cpu.march() == 'x86-64-v3' and cpu.library().tt_linear16_path() == 0\n"
              "out = {d: LLM(dtype=d).generate(['Once upon a time'], SamplingParams(max_tokens=12, temperature=0,"
              " ignore_eos=True))[0].token_ids for d in ('bfloat16', 'float16')}\nprint(json.dumps(out))\n")
    env = {**os.environ, "TOKENTRACE_CPU_MARCH": "x86-64-v3"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    fallback = json.loads(done.stdout.strip().splitlines()[-1])
    for dtype, tokens in fallback.items():
        native = LLM(dtype=dtype).generate(["Once upon a time"], SamplingParams(max_tokens=12, temperature=0,
                                                                                ignore_eos=True))[0].token_ids
        assert tokens == native


@pytest.mark.parametrize("dtype", [torch.float32, *DTYPES])
def test_rows_of_ids_outside_the_table_are_refused(dtype):
    """tt_blocked_rows reads nothing for an id outside [0, N): an IndexError, as torch's index gives."""
    bw = cpu.BlockedWeight.of(torch.randn(10, 40), dtype)
    for bad in (10, -1, 1 << 40):
        with pytest.raises(IndexError):
            bw.rows(torch.tensor([0, bad]))
    assert torch.equal(bw.rows(torch.tensor([[9]])), bw.unblocked().float()[9:10].view(1, 1, 40))


@pytest.mark.parametrize("arch", ARCHES)
def test_bfloat16_weights_multiply_x_rounded_to_bfloat16(arch):
    """A one-column weight of 1 times x is x as the kernel multiplies it: rounded to the
    nearest bfloat16 (ties to even) on the dot-product path and on the widening one alike;
    float16 weights keep x as it is."""
    lib = cpu.load(arch)
    x = torch.tensor([[1 + 2 ** -10], [1 + 3 * 2 ** -8], [-3.3e-3], [1 + 2 ** -8], [7.0]])  # the 4th: a tie, to even
    one = torch.ones(1, 1)
    y = cpu.linear(x, cpu.BlockedWeight.of(one, torch.bfloat16), lib=lib)
    assert torch.equal(y, x.to(torch.bfloat16).float())
    assert y[3, 0].item() == 1.0 and y[1, 0].item() == 1 + 4 * 2 ** -8
    assert torch.equal(cpu.linear(x, cpu.BlockedWeight.of(one, torch.float16), lib=lib), x)


def test_bfloat16_rows_past_the_kernel_form_the_same_products():
    """Over MAX_ROWS rows a layer leaves the kernel for PyTorch's GEMM on the widened weight:
    it rounds x as the kernel does, so a row's output does not depend on how many rows share
    its pass (a prefill against a decode step, a verification round)."""
    from engine.layers.linear import Linear
    g = torch.Generator().manual_seed(3)
    layer = Linear(300, 70, bias=False)
    layer.weight.data = torch.randn(70, 300, generator=g)
    layer.pack(True, torch.bfloat16)
    x = torch.randn(cpu.MAX_ROWS + 8, 300, generator=g)
    many, one = layer(x), layer(x[:1])
    assert torch.allclose(many[:1], one, rtol=0, atol=1e-4 * one.abs().max().item())
    assert not torch.allclose(many[:1], F.linear(x[:1], layer.blocked.unblocked().float()), rtol=0, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("rows,exact", [(5, 3), (6, 2), (4, 4), (33, 31), (3, 0)])
def test_exact_rows_keep_x_the_rest_round_it(arch, rows, exact):
    """tt_linear_bf16_exact (the logit lens's rows beside the model's own in one pass over the
    LM head): the first `exact` rows meet the weight with x kept to 16 mantissa bits (hi + lo),
    the others with x rounded, bit for bit what a call of their own gives."""
    lib = cpu.load(arch)
    g = torch.Generator().manual_seed(rows * 10 + exact)
    w, x = torch.randn(70, 300, generator=g), torch.randn(rows, 300, generator=g)
    bw = cpu.BlockedWeight.of(w, torch.bfloat16)
    y = cpu.linear(x, bw, lib=lib, exact_rows=exact)
    w16 = w.to(torch.bfloat16).double()
    assert torch.equal(y[exact:], cpu.linear(x[exact:], bw, lib=lib))  # the rounded rows: as on their own
    if not exact:
        return
    exact_ref = F.linear(x[:exact].double(), w16)
    scale = (x[:exact].double().abs() @ w16.abs().T).max().item()
    err = (y[:exact].double() - exact_ref).abs().max().item()
    assert err <= scale * (2.0 ** -16 + 4e-7 * 300 ** 0.5)
    rounded_ref = F.linear(cpu.as_multiplied(x[:exact], torch.bfloat16).double(), w16)
    assert err < (rounded_ref - exact_ref).abs().max().item() / 20  # kept, not rounded
