"""The CPU's C kernels (engine/kernels/cpu_linear.c) against PyTorch's own matmul.

They need a C compiler; without one they skip, unless TOKENTRACE_REQUIRE_CPU_KERNELS=1
(set by .ci/run), where a kernel that cannot build fails instead."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import cpu
from engine.layers.linear import Linear

if not cpu.available():
    if os.environ.get("TOKENTRACE_REQUIRE_CPU_KERNELS") == "1":
        cpu.build()  # raises with the compiler's message
        raise AssertionError("the CPU kernels built but did not load")
    pytest.skip("no C compiler for the CPU kernels", allow_module_level=True)


def close(a: torch.Tensor, b: torch.Tensor, k: int) -> None:
    # a float32 dot product of k terms summed in another order: ~sqrt(k) ulps of its scale
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * k ** 0.5 * b.abs().max().item())


@pytest.mark.parametrize("n,k", [(8, 16), (576, 576), (960, 576), (577, 576), (10, 37), (3, 5), (130, 1536)])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 33])
def test_linear_matches_torch(n, k, rows):
    g = torch.Generator().manual_seed(n * 1000 + k + rows)
    w, x, bias = torch.randn(n, k, generator=g), torch.randn(rows, k, generator=g), torch.randn(n, generator=g)
    bw = cpu.BlockedWeight.of(w)
    close(cpu.linear(x, bw), F.linear(x, w), k)
    close(cpu.linear(x, bw, bias), F.linear(x, w, bias), k)


@pytest.mark.parametrize("threads", [1, 2])
def test_large_matrix_split_between_threads(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w, x = torch.randn(4099, 300), torch.randn(5, 300)
        close(cpu.linear(x, cpu.BlockedWeight.of(w)), F.linear(x, w), 300)
    finally:
        torch.set_num_threads(before)


def test_strided_and_batched_inputs():
    w = torch.randn(64, 48)
    bw = cpu.BlockedWeight.of(w)
    wide = torch.randn(6, 100)
    x = wide[:, 10:58]  # rows 100 floats apart: read in place, not copied
    close(cpu.linear(x, bw), F.linear(x, w), 48)
    cols = torch.randn(48, 6).t()  # column-major: copied to rows first
    close(cpu.linear(cols, bw), F.linear(cols, w), 48)
    x3 = torch.randn(2, 3, 48)
    assert cpu.linear(x3, bw).shape == (2, 3, 64)
    close(cpu.linear(x3, bw), F.linear(x3, w), 48)
    assert cpu.linear(torch.randn(0, 48), bw).shape == (0, 64)


def test_blocked_layout():
    w = torch.arange(10 * 20, dtype=torch.float32).view(10, 20)
    bw = cpu.BlockedWeight.of(w)
    assert bw.data.shape == (2, 2, 8, 16)  # 10 rows -> 2 blocks of 8, 20 columns -> 2 of 16
    assert bw.data[0, 1, 3, 2].item() == w[3, 18].item()  # block 0, columns 16-31, row 3, column 16 + 2
    assert bw.data[1, 0, 1, 4].item() == w[9, 4].item()
    assert bw.data[1, 0, 2:].abs().sum() == 0 and bw.data[:, 1, :, 4:].abs().sum() == 0  # zero padding


@pytest.mark.parametrize("n,k", [(10, 20), (8, 16), (1, 1), (33, 577)])
def test_blocking_in_c_equals_torch(n, k):
    w = torch.randn(n, k)
    assert torch.equal(cpu.BlockedWeight.of(w).data, cpu.block_reference(w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_linear_layer_takes_the_kernel_for_few_rows_only(dtype):
    """The blocked copy is the layer's only one (the oracle keeps its own): few rows through
    the kernel, a prefill-sized batch through PyTorch's GEMM on the copy read back; and
    pack(on=False) restores the parameter from it."""
    torch.manual_seed(0)
    layer = Linear(96, 200, bias=True)
    w = layer.weight.detach().to(dtype).float()  # what the layer stores, widened
    limit = cpu.kernel_rows(dtype)  # past it, PyTorch's GEMM; an AVX2 build keeps MAX_ROWS
    wide = cpu.library().tt_vector_bits() >= 512
    tiles = dtype == torch.bfloat16 and cpu.amx_bf16()  # bfloat16 products on AMX past AMX_BF16_ROWS
    assert limit == (cpu.MAX_ROWS if not wide else cpu.AMX_BF16_ROWS if tiles else max(
        cpu.MAX_ROWS, cpu.PREFILL_KERNEL_ROWS[dtype if dtype != torch.bfloat16 or cpu.library().tt_linear16_path()
                                              else torch.float16]))
    few, mid = torch.randn(1, 96), torch.randn(cpu.MAX_ROWS + 5, 96)
    many = torch.randn(limit + 1, 96) if limit < 4096 else None
    layer.pack(dtype=dtype)
    assert layer.blocked is not None and layer.packed is None and layer._parameters["weight"] is None
    assert torch.equal(layer.weight, w)  # read back from the blocked copy, for code that reads the matrix
    assert layer.blocked.dtype == dtype
    # x as the kernel multiplies it: rounded to bfloat16 against bfloat16 weights
    close(layer(few), F.linear(cpu.as_multiplied(few, dtype), w, layer.bias), 96)
    # a short prefill chunk: the kernel on an AVX-512 build, the GEMM on an AVX2 one; close either way
    close(layer(mid), F.linear(cpu.as_multiplied(mid, dtype), w, layer.bias), 96)
    if many is not None:  # a longer one goes to PyTorch's GEMM: bit for bit F.linear on the stored weight
        with torch.backends.mkldnn.flags(enabled=True, fp32_precision="bf16" if tiles else "none"):
            expected = F.linear(cpu.as_multiplied(many, dtype), w, layer.bias)
        assert torch.equal(layer(many), expected)
        assert torch.backends.mkldnn.matmul.fp32_precision == "none"  # the AMX setting was put back
    layer.pack(on=False)
    assert layer.blocked is None and torch.equal(layer.weight, w)


def test_build_is_cached_by_content(tmp_path):
    first = cpu.build(tmp_path)
    mtime = first.stat().st_mtime_ns
    assert cpu.build(tmp_path) == first and first.stat().st_mtime_ns == mtime  # not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary files left


def test_switched_off_by_environment(cpu_kernels_switch):
    assert not cpu_kernels_switch(False)
    assert cpu.library() is None and cpu.blocked_weight(torch.randn(4, 4)) is None
    layer = Linear(64, 1 << 15)
    layer.pack()
    assert layer.blocked is None and layer.packed is not None  # oneDNN instead
    assert cpu_kernels_switch(True)


def test_engine_runs_its_linears_through_the_kernel():
    """The parity tests (test_parity, test_real_models) then check the kernel's logits and
    greedy tokens against transformers."""
    from engine.llm import LLM
    llm = LLM()
    layers = [m for m in llm.engine.runner.model.modules() if isinstance(m, Linear)]
    assert layers and all(m.blocked is not None for m in layers)


def test_start_up_line_names_the_kernels_weights_their_only_copy():
    from app.__main__ import _mb, build_service, memory_line, parse_args
    from engine.info import tensor_bytes
    service = build_service(parse_args(["--device", "cpu", "--draft", "none"]))
    model = service.engine.runner.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    moe = [m for m in model.modules() if getattr(m, "c_experts", None) is not None]
    assert linears and moe  # the embedded model: a MoE, whose experts are blocked one after another
    # one copy of each weight: the blocked one; the tied embedding reads the LM head's
    assert all(m.blocked is not None and m._parameters["weight"] is None for m in linears)
    assert all(m.experts_gate_up is None and m.experts_down is None for m in moe)
    assert model.model.embed_tokens.weight is None and model.model.embed_tokens.tied is model.lm_head
    blocked = sum(m.blocked.nbytes for m in linears) + sum(w.nbytes for m in moe for w in m.c_experts.blocked_weights())
    assert cpu.blocked_bytes(model) == blocked
    info = service.engine.describe().model
    assert info.weights_bytes == tensor_bytes(model) + blocked and info.kernel_weight_bytes == blocked
    assert f"weights {_mb(info.weights_bytes)}" in memory_line(service)
    assert f"; decode linears through the C kernels ({_mb(blocked)} of the weights in their layout, float32)" \
        in memory_line(service)


def experts_reference(x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                      down: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The routed experts' weighted sum, row by row, in float64 on each matmul's input as the
    kernels multiply it (cpu.as_multiplied)."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for e, w in zip(experts[t].tolist(), weights[t].tolist()):
            gate, up = (cpu.as_multiplied(x[t], dtype).double() @ gate_up[e].double().T).chunk(2)
            h = (F.silu(gate) * up).float()
            out[t] += w * (cpu.as_multiplied(h, dtype).double() @ down[e].double().T)
    return out.float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("inter", [3, 4])  # 2 x 3 rows do not fill a block of 8
def test_moe_experts_through_the_kernel(inter, dtype):
    """SparseMoE in one C call (routing and experts, cpu_moe.c), for a lone token and a decode
    batch, against the same block on PyTorch's matmuls with the weights rounded as stored;
    and read back (pack(on=False)) to the parameters."""
    from engine.config import ModelConfig
    from engine.layers.mlp import SparseMoE
    cfg = ModelConfig.from_hf({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 40,
                               "intermediate_size": inter, "num_local_experts": 4, "num_experts_per_tok": 2,
                               "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                               "vocab_size": 10})
    torch.manual_seed(inter)
    moe = SparseMoE(cfg, 0)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn_like(p).to(dtype).float())  # exact in dtype: the reference sees what is stored
    params = [p.detach().clone() for p in (moe.experts_gate_up, moe.experts_down)]
    one, batch = torch.randn(1, 40), torch.randn(3, 40)
    expected = {1: moe(one), 3: moe(batch)}
    routes = {n: moe.route(x) for n, x in ((1, one), (3, batch))}
    from engine.layers.linear import pack_weights
    pack_weights(moe, dtype=dtype)
    assert moe.c_experts is not None and moe.experts_gate_up is None and moe.gate.blocked.dtype == dtype
    for n, x in ((1, one), (3, batch)):
        out, experts, weights = moe.c_experts.forward(x, router=moe.gate.blocked)
        assert torch.equal(experts, routes[n][0])
        # the router on the kernel (at bfloat16 its logits see x rounded: the weights move by up to ~1%)
        rtol = 2e-2 if dtype == torch.bfloat16 else 1e-4
        torch.testing.assert_close(weights, routes[n][1], rtol=rtol, atol=rtol / 10)
        # each matmul's input as the kernel multiplies it (rounded to bfloat16 against bfloat16 weights)
        # (the kernel's router reads x rounded too, so its weights move by ~1e-4: each side's own weights)
        want = experts_reference(x, experts, weights, *params, dtype)
        close(out, want, 40)
        close(moe(x), want, 40)
        close(moe.routed(x, *routes[n], None), experts_reference(x, *routes[n], *params, dtype), 40)  # routing given
        if dtype != torch.bfloat16:
            close(out, expected[n], 40)  # and against the block on PyTorch's matmuls
    pack_weights(moe, on=False)
    assert moe.c_experts is None
    assert torch.equal(moe.experts_gate_up, params[0]) and torch.equal(moe.experts_down, params[1])
    close(moe(batch), expected[3], 40)


@pytest.mark.parametrize("offset", [False, True])
@pytest.mark.parametrize("shape", [(1, 576), (3, 40), (2, 5, 24), (600, 96)])  # 600: a prefill chunk
def test_rms_norm_matches_torch(offset, shape):
    from engine.layers.norm import RMSNorm
    norm = RMSNorm(shape[-1], 1e-6, offset)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(shape) * 3
    scale = (1.0 + norm.weight) if offset else norm.weight
    expected = F.rms_norm(x, (shape[-1],), scale.detach(), 1e-6)
    assert cpu.rms_norm(x, norm.weight, 1e-6, 1.0 if offset else 0.0).shape == x.shape
    torch.testing.assert_close(norm(x), expected, rtol=1e-5, atol=1e-6)
    wide = torch.randn(shape[0], shape[-1] + 7)[:, 3:3 + shape[-1]]  # rows read in place
    if len(shape) == 2:
        torch.testing.assert_close(norm(wide), F.rms_norm(wide, (shape[-1],), scale.detach(), 1e-6),
                                   rtol=1e-5, atol=1e-6)


def _smaps_kb(t: torch.Tensor, field: str) -> int:
    """A field's kB (AnonHugePages, Rss) of the mapping that holds t, from /proc/self/smaps."""
    addr, kb, inside = t.data_ptr(), 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == field + ":":
                kb = int(line.split()[1])
    return kb


def _huge_pages_in(t: torch.Tensor) -> int:
    """kB of transparent huge pages backing the mapping that holds t."""
    return _smaps_kb(t, "AnonHugePages")


def test_weight_copies_and_kv_pool_ask_for_huge_pages():
    small = cpu.huge_page_empty((100, 3))
    assert small.shape == (100, 3) and small.dtype == torch.float32
    t = cpu.huge_page_empty((3, 1 << 20), torch.float32).fill_(1.0)  # 12 MB, written after the madvise
    assert t.shape == (3, 1 << 20) and t.is_contiguous() and t.sum().item() == 3 << 20
    assert t.data_ptr() % cpu.HUGE_PAGE == 0
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            offered = "[never]" not in f.read()
    except OSError:
        offered = False
    if offered:  # Linux with THP in 'madvise' or 'always' mode: the written 2 MB pages are huge ones
        assert _huge_pages_in(t) >= 2048
    w = cpu.BlockedWeight.of(torch.randn(4096, 576))  # 9 MB: the layer's copy is aligned the same way
    assert w.data.data_ptr() % cpu.HUGE_PAGE == 0


def test_a_kv_pool_is_zeros_without_being_written():
    # 64 MB, the way the KV pool is made: all zeros, and nothing resident until a page is written
    pool = cpu.huge_page_zeros((2, 4, 512, 16, 3, 64), torch.float32)
    assert _smaps_kb(pool, "Rss") < 4096
    assert not pool.any() and torch.count_nonzero(pool[1, 3]).item() == 0
    assert not cpu.huge_page_zeros((7, 5), torch.bfloat16).any()  # a small one, from the shared arena


def test_weights_under_2_mb_share_huge_pages():
    # SmolLM2's o projection at bfloat16 (0.66 MB): on a 4 KB page of a shared chunk that asked for
    # 2 MB pages, apart from its neighbours, and readable back as written
    ws = [cpu.BlockedWeight.of(torch.randn(576, 576), torch.bfloat16) for _ in range(3)]
    starts = sorted(w.data.data_ptr() for w in ws)
    assert all(p % 4096 == 0 for p in starts) and all(b - a >= ws[0].nbytes for a, b in zip(starts, starts[1:]))
    probe = torch.randn(576, 576).to(torch.bfloat16)
    assert torch.equal(cpu.BlockedWeight.of(probe, torch.bfloat16).unblocked(), probe)
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            offered = "[never]" not in f.read()
    except OSError:
        offered = False
    if offered:
        assert all(_huge_pages_in(w.data) >= 2048 for w in ws)


def test_a_cpu_load_maps_no_triton():
    # building the model on the meta device ran nn.Embedding's random init there, through torch._dynamo,
    # whose import loads triton's library: 66 MB more resident memory in every CPU process (issue 30's 1.15x)
    import subprocess
    import sys
    script = ("import sys\nfrom engine.llm_engine import LLMEngine\nLLMEngine(device='cpu')\n"
              "print('triton' in sys.modules, 'torch._dynamo' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["False", "False"], done.stdout
