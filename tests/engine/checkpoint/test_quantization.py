"""Weight-only int8 / int4 decoding (engine/layers/quantized.py, engine/checkpoint/quantize.py): the
kernels (the C ones, and PyTorch's where those cannot build) against plain-torch
dequantized references, GGUF Q8_0 / Q4_0 / Q4_1 codes used as they are and read as the
`gguf` package reads them, the agreement with float32 on the embedded model, and bad
values refused."""
import os

import pytest
import torch

from engine import LLM, SamplingParams
from benchmarks.bench.agreement import agreement
from engine.config import EngineConfig
from engine.forward import prompt_logits
from engine.kernels import cpu, cpu_quant
from engine.layers import quantized
from engine.layers.quantized import dequantize_codes, int4_from_codes, quantize_int4, quantize_int8

gguf = pytest.importorskip("gguf")


def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).double()


def need_c_kernels() -> None:
    """Skip without a C compiler, unless TOKENTRACE_REQUIRE_CPU_KERNELS=1 (CI): then fail."""
    if not cpu_quant.available():
        if os.environ.get("TOKENTRACE_REQUIRE_CPU_KERNELS") == "1":
            raise AssertionError("the CPU kernels (engine/kernels/cpu_quant.c) did not build")
        pytest.skip("no C compiler for the CPU kernels")


@pytest.fixture(params=["c", "torch"])
def kernels(request, monkeypatch):
    """Each test twice: with the C kernels, and with PyTorch's (as without a compiler)."""
    if request.param == "torch":
        monkeypatch.setenv("TOKENTRACE_CPU_KERNELS", "0")
    else:
        need_c_kernels()
    cpu.library.cache_clear()
    cpu_quant.library.cache_clear()
    assert quantized.c_kernels() == (request.param == "c")
    yield request.param
    cpu.library.cache_clear()
    cpu_quant.library.cache_clear()


def test_int4_kernel_equals_dequantized_reference(kernels):
    g = torch.Generator().manual_seed(0)
    n, k = 96, 128
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d = bf16(torch.rand(n, k // 32, generator=g) * 0.1).float()  # PyTorch's kernel stores bfloat16
    m = bf16(torch.randn(n, k // 32, generator=g) * 0.1 - 8 * d).float()
    x = torch.randn(5, k, generator=g)
    y = int4_from_codes(codes, d, m, "test").linear(x)
    assert y.dtype == torch.float32 and y.shape == (5, n)
    if kernels == "c":  # float32 throughout: float32 roundings only
        ref = x.double() @ dequantize_codes(codes, d, m).double().T
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    else:  # the input is rounded to bfloat16 and the result returned in bfloat16: ~3 significant digits
        ref = bf16(x) @ bf16(dequantize_codes(codes, d, m)).T
        torch.testing.assert_close(y.double(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())


def test_int8_kernel_equals_dequantized_reference(kernels):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(80, 96, generator=g)
    x = torch.randn(3, 96, generator=g)
    qw = quantize_int8(w)
    if kernels == "c":  # one scale per 32 inputs, in the C kernel's records
        assert qw.blocked is not None and qw.blocked.kind == "int8"
        deq = qw.blocked.dequantize().double()
        step = (w.abs().view(80, 3, 32).amax(-1) / 127).repeat_interleave(32, dim=1).double()
        ref = x.double() @ deq.T
        torch.testing.assert_close(qw.linear(x).double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
        assert ((deq - w.double()).abs() <= step * 0.5 + 1e-7).all()  # within half a step
    else:  # PyTorch's kernel: one scale per row
        assert qw.data.dtype == torch.int8 and qw.scales.shape == (80,)
        deq = qw.data.double() * qw.scales.double()[:, None]
        ref = bf16(x) @ deq.T
        torch.testing.assert_close(qw.linear(x).double(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
        assert (deq - w.double()).abs().max() <= qw.scales.double().max() * 0.51  # within half a step (+ rounding)


def test_int8_groups_are_closer_than_rows(kernels):
    """A row with one large weight (an outlier): per-row int8 gives all its weights coarse
    steps, groups of 32 only the outlier's group."""
    w = torch.randn(16, 256, generator=torch.Generator().manual_seed(4)) * 0.02
    w[:, 5] = 1.0
    s = w.abs().amax(1, keepdim=True) / 127
    row_err = ((w / s).round() * s - w).abs().mean().item()
    err = (quantize_int8(w).linear(torch.eye(256)).T - w).abs().mean().item()
    if kernels == "c":
        assert err < row_err / 4, (err, row_err)
    else:
        assert err == pytest.approx(row_err, rel=0.1)  # bfloat16 scales


def test_int4_quantization_error_is_within_half_a_step(kernels):
    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 256, generator=g)
    qw = quantize_int4(w)
    # the dequantized weight, read back through the kernel with x = identity (exact in bfloat16)
    deq = qw.linear(torch.eye(256)).T.double()
    groups = w.view(64, 8, 32)
    step = ((groups.amax(-1) - groups.amin(-1)) / 15).repeat_interleave(32, dim=1).double()
    err = (deq - w.double()).abs()
    slack = 1e-6 if kernels == "c" else 0.02 * w.abs().double() + 1e-3  # PyTorch's: bfloat16 roundings
    assert (err <= 0.5 * step + slack).all()
    assert qw.nbytes < w.numel() * 4 / 5  # codes at half a byte, scales and offsets per 32


@pytest.fixture(scope="module")
def block_gguf(tmp_path_factory):
    """The tiny llama written by the `gguf` package's own writer and quantizer, one file per type."""
    from tests.gguf_writer import tiny_model, write_gguf
    from tests.tiny import save_tokenizer
    tok = tmp_path_factory.mktemp("tok")
    save_tokenizer(tok)
    files = {}
    for qtype in (gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0):
        model = tiny_model("LlamaConfig", seed=3, tie_word_embeddings=False)
        files[qtype.name] = write_gguf(model, tok, tmp_path_factory.mktemp(qtype.name) / "m.gguf", qtype)
    return files


@pytest.mark.parametrize("qtype", ["Q4_1", "Q4_0", "Q8_0"])
def test_gguf_codes_dequantize_as_the_gguf_package_does(block_gguf, qtype):
    """Our reading of a file's blocks (codes, d, m) stands for exactly the weights that the
    `gguf` package's own dequantize gives, and so does the C kernel's record stream."""
    from engine.checkpoint.gguf import block_codes
    reader = gguf.GGUFReader(block_gguf[qtype])
    matrices = [t for t in reader.tensors if t.tensor_type.name == qtype]
    assert len(matrices) == 3 * 7 + 2  # per layer q, k, v, o, gate, up, down; the embedding and the head
    for t in matrices:
        q, d, m, name = block_codes(t)
        assert name == qtype and q.dtype == (torch.int8 if qtype == "Q8_0" else torch.uint8)
        expected = torch.from_numpy(gguf.dequantize(t.data, t.tensor_type)).reshape(q.shape)
        assert torch.equal(dequantize_codes(q, d, m), expected), t.name
        if cpu_quant.available():
            bw = (cpu_quant.BlockedQuantWeight.int8(q, d) if qtype == "Q8_0"
                  else cpu_quant.BlockedQuantWeight.int4(q, d, m))
            assert torch.equal(bw.dequantize(), expected), t.name


@pytest.mark.parametrize("qtype, kind", [("Q4_1", "int4"), ("Q4_0", "int4"), ("Q8_0", "int8")])
def test_gguf_blocks_are_used_as_they_are(block_gguf, qtype, kind, kernels, monkeypatch, tmp_path):
    """Every layer of a Q4 file (int4) or a Q8_0 file (int8) takes the file's codes: the
    same weights as the float32 engine (which dequantizes them). With the C kernels only
    float32 summation order separates the two; PyTorch's round to bfloat16, and their int8
    (one scale per row) requantizes a Q8_0 file."""
    monkeypatch.setenv("TOKENTRACE_CACHE", str(tmp_path))
    path = block_gguf[qtype]
    f32 = LLM(path, dtype="float32", block_size=4)
    q = LLM(path, dtype="float32", block_size=4, quantization=kind)
    report = q.engine.runner.model.quantization
    ids = list(range(5, 5 + cpu.MAX_ROWS))  # up to MAX_ROWS rows a prompt runs through the kernel itself
    base, logits = prompt_logits(f32.engine, ids), prompt_logits(q.engine, ids)
    top1, kl = agreement(base, logits)
    if kernels == "torch" and kind == "int8":
        assert report.from_file == {} and report.at_load == 3 * 4 + 1
        assert top1 >= 0.9 and kl < 1e-2, (top1, kl)
        return
    assert report.from_file == {qtype: 3 * 4 + 1}  # per layer qkv, o, gate_up, down; and the LM head
    assert report.at_load == 0 and not report.kept_float
    lin = q.engine.runner.model.model.layers[0].self_attn.qkv_proj
    assert lin.weight is None and lin.qweight.source == f"GGUF {qtype}"  # the float copy is freed
    if kernels == "c":
        torch.testing.assert_close(logits, base, rtol=1e-4, atol=1e-4 * base.abs().max().item())
        assert top1 == 1.0 and not torch.equal(logits, base)  # other arithmetic: the kernel's, not F.linear's
        longer = list(range(5, 60))  # a longer prompt: the dequantized weight through PyTorch's GEMM
        torch.testing.assert_close(prompt_logits(q.engine, longer), prompt_logits(f32.engine, longer))
        params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
        assert [o.token_ids for o in q.generate(["The little dog", "Once"], params)] == \
            [o.token_ids for o in f32.generate(["The little dog", "Once"], params)]
    else:
        assert top1 >= 0.95 and kl < 2e-3, (top1, kl)


def test_tied_head_takes_the_embeddings_q8_0_codes(tmp_path, monkeypatch):
    """SmolLM2's layout: Q4_1 layers, a tied LM head whose embedding is stored as Q8_0. Under
    int4 and int8 alike the head takes the embedding's Q8_0 codes, so under int4 every
    quantized weight is the float32 engine's."""
    import tests.gguf_writer as tg
    from tests.tiny import save_tokenizer
    need_c_kernels()  # Q8_0 codes run in the C kernels only
    monkeypatch.setenv("TOKENTRACE_CACHE", str(tmp_path))
    save_tokenizer(tmp_path / "tok")
    model = tg.tiny_model("LlamaConfig", seed=4, tie_word_embeddings=True)
    vocab, encode = model.config.vocab_size, tg.encode
    # the embedding as Q8_0, the rest as Q4_1 (as llama.cpp's Q4_1 files keep it)
    monkeypatch.setattr(tg, "encode", lambda w, qtype, rng: encode(
        w, gguf.GGMLQuantizationType.Q8_0 if w.ndim == 2 and w.shape[0] == vocab else qtype, rng))
    path = tg.write_gguf(model, tmp_path / "tok", tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q4_1)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types["token_embd.weight"] == "Q8_0" and "output.weight" not in types
    f32 = LLM(path, dtype="float32", block_size=4)
    ids = list(range(5, 5 + cpu.MAX_ROWS))
    base = prompt_logits(f32.engine, ids)
    for kind, from_file in (("int4", {"Q4_1": 12, "Q8_0": 1}), ("int8", {"Q8_0": 1})):
        q = LLM(path, dtype="float32", block_size=4, quantization=kind)
        report = q.engine.runner.model.quantization
        assert report.from_file == from_file and report.at_load == 13 - sum(from_file.values()), report.summary()
        assert q.engine.runner.model.model.embed_tokens.weight is not None  # the table stays float
        assert q.engine.runner.model.lm_head.qweight.kind == "int8"
        if kind == "int4":
            assert "1 from GGUF Q8_0 blocks (the LM head, int8)" in report.summary()
            logits = prompt_logits(q.engine, ids)
            torch.testing.assert_close(logits, base, rtol=1e-4, atol=1e-4 * base.abs().max().item())


PROMPTS = ["Once upon a time", "The little dog", "One day, a girl named Lily", "Tom and Sam went to the park",
           "The sun was"]


@pytest.fixture(scope="module")
def float_run():
    """float32's greedy answers, as whole sequences (prompt + answer), and where each answer starts."""
    outs = LLM().generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    return [(o.prompt_token_ids + o.token_ids, len(o.prompt_token_ids)) for o in outs]


# The share of float32's greedy tokens that the quantized model picks too, fed the same
# context (teacher forcing: one early difference does not turn every later token into one).
# Measured on the embedded model (5 prompts x 24 tokens), C kernels / PyTorch's: int8 0.983 /
# 0.975, int4 0.967 / 0.933 (free-running, the toy model's near-ties make the answers part
# after 0-24 tokens).
@pytest.mark.parametrize("kind, threshold", [("int8", 0.9), ("int4", 0.85)])
def test_greedy_agreement_with_float32_on_the_embedded_model(float_run, kind, threshold, kernels):
    llm = LLM(quantization=kind)
    report = llm.engine.runner.model.quantization
    assert report.kind == kind and report.at_load > 0 and report.c_kernels == (kernels == "c")
    same = total = 0
    for seq, n in float_run:
        picks = prompt_logits(llm.engine, seq)[n - 1:-1].argmax(-1)
        same += (picks == torch.tensor(seq[n:])).sum().item()
        total += len(seq) - n
    assert same / total >= threshold, (same, total, report.summary())
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks  # pages given back


@pytest.mark.parametrize("bad", ["int3", "fp8", "INT4 "])
def test_bad_quantization_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="unsupported quantization .*choose one of int8, int4"):
        EngineConfig(quantization=bad)
    with pytest.raises(ValueError, match="unsupported quantization"):
        LLM(quantization=bad)


def test_quantization_with_tensor_parallelism_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="quantization='int8' with tensor_parallel_size=2 is not built"):
        EngineConfig(quantization="int8", tensor_parallel_size=2)


def test_app_option_reaches_the_engine_and_the_page(capsys):
    from app.__main__ import build_service, memory_line, parse_args
    from app.page.layout import model_summary
    svc = build_service(parse_args(["--quantization", "int4", "--device", "cpu"]))
    info = svc.model_info()
    assert info["quantization"].startswith("int4 weights (") and "LM head to int8" in info["quantization"]
    assert f"float32 with {info['quantization']} on cpu" in model_summary(info)  # beside the dtype
    assert "int4 weights" in memory_line(svc)
    with pytest.raises(SystemExit):
        parse_args(["--quantization", "int3"])
    assert "invalid choice: 'int3'" in capsys.readouterr().err


def test_bandwidth_view_counts_the_packed_bytes():
    """The bench's bytes-per-step (bandwidth section) reads the codes and scales, not the float weights."""
    from benchmarks.bench.bandwidth import decode_bytes_per_token
    f32, int8 = LLM().engine, LLM(quantization="int8").engine
    report = int8.runner.model.quantization
    drop = decode_bytes_per_token(f32.runner.model, f32.model_config, 0) - \
        decode_bytes_per_token(int8.runner.model, int8.model_config, 0)
    # every quantized Linear's float weight gone, its codes and scales added; the tied LM head
    # keeps the embedding's float matrix, so only its int8 copy (in report.bytes) is added
    quantized_float = sum(m.blocked.nbytes for n, m in f32.runner.model.named_modules()  # float32, blocked: the only copy
                          if n.endswith(("proj", "mlp.gate")))
    assert drop == quantized_float - report.bytes
