"""Weight-only int8 / int4 decoding (engine/layers/quantized.py, engine/quantize.py): the
packed kernels against plain-torch dequantized references, GGUF Q4_0 / Q4_1 codes used as
they are, the agreement with float32 on the embedded model, and bad values refused."""
import pytest
import torch

from engine import LLM, SamplingParams
from engine.bench import agreement, prompt_logits
from engine.config import EngineConfig
from engine.layers.quantized import dequantize_codes, int4_from_codes, quantize_int4, quantize_int8

gguf = pytest.importorskip("gguf")


def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).double()


def test_int4_kernel_equals_dequantized_reference():
    g = torch.Generator().manual_seed(0)
    n, k = 96, 128
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scale = bf16(torch.rand(n, k // 32, generator=g) * 0.1).float()  # the kernel's scales are bfloat16
    zero = bf16(torch.randn(n, k // 32, generator=g) * 0.1).float()
    x = torch.randn(5, k, generator=g)
    ref = bf16(x) @ dequantize_codes(codes, scale, zero).double().T  # the input is rounded to bfloat16 too
    y = int4_from_codes(codes, scale, zero, "test").linear(x)
    assert y.dtype == torch.float32 and y.shape == (5, n)
    # the kernel returns bfloat16: ~3 significant digits
    torch.testing.assert_close(y.double(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())


def test_int8_kernel_equals_dequantized_reference():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(80, 96, generator=g)
    x = torch.randn(3, 96, generator=g)
    qw = quantize_int8(w)
    assert qw.data.dtype == torch.int8 and qw.scales.shape == (80,)
    deq = qw.data.double() * qw.scales.double()[:, None]
    ref = bf16(x) @ deq.T
    torch.testing.assert_close(qw.linear(x).double(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
    assert (deq - w.double()).abs().max() <= qw.scales.double().max() * 0.51  # within half a step (+ rounding)


def test_int4_quantization_error_is_within_half_a_step():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 256, generator=g)
    qw = quantize_int4(w)
    # the dequantized weight, read back through the kernel with x = identity (exact in bfloat16)
    deq = qw.linear(torch.eye(256)).T.double()
    groups = w.view(64, 8, 32)
    step = ((groups.amax(-1) - groups.amin(-1)) / 15).repeat_interleave(32, dim=1).double()
    err = (deq - w.double()).abs()
    assert (err <= 0.5 * step + 0.02 * w.abs().double() + 1e-3).all()  # half a step, plus bfloat16 roundings
    assert qw.nbytes < w.numel() * 4 / 6  # codes at half a byte, scales per 32


@pytest.fixture(scope="module")
def q4_gguf(tmp_path_factory):
    from tests.test_gguf import tiny_model, write_gguf
    from tests.tiny import save_tokenizer
    tok = tmp_path_factory.mktemp("tok")
    save_tokenizer(tok)
    files = {}
    for qtype in (gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q4_0):
        model = tiny_model("LlamaConfig", seed=3, tie_word_embeddings=False)
        files[qtype.name] = write_gguf(model, tok, tmp_path_factory.mktemp(qtype.name) / "m.gguf", qtype)
    return files


@pytest.mark.parametrize("qtype", ["Q4_1", "Q4_0"])
def test_gguf_q4_blocks_are_used_as_they_are(q4_gguf, qtype, monkeypatch, tmp_path):
    """Every layer of a Q4 file takes the file's codes: same weights as the float32 engine
    (which dequantizes them), so only the bfloat16 roundings separate the two."""
    monkeypatch.setenv("TOKENTRACE_CACHE", str(tmp_path))
    path = q4_gguf[qtype]
    f32 = LLM(path, dtype="float32", block_size=4)
    q4 = LLM(path, dtype="float32", block_size=4, quantization="int4")
    report = q4.engine.runner.model.quantization
    assert report.from_file == {qtype: 3 * 4 + 1}  # per layer qkv, o, gate_up, down; and the LM head
    assert report.at_load == 0 and not report.kept_float
    lin = q4.engine.runner.model.model.layers[0].self_attn.qkv_proj
    assert lin.weight is None and lin.qweight.source == f"GGUF {qtype}"  # the float copy is freed
    ids = list(range(5, 60))
    top1, kl = agreement(prompt_logits(f32.engine, ids), prompt_logits(q4.engine, ids))
    assert top1 >= 0.95 and kl < 2e-3, (top1, kl)


PROMPTS = ["Once upon a time", "The little dog", "One day, a girl named Lily", "Tom and Sam went to the park",
           "The sun was"]


@pytest.fixture(scope="module")
def float_run():
    """float32's greedy answers, as whole sequences (prompt + answer), and where each answer starts."""
    outs = LLM().generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    return [(o.prompt_token_ids + o.token_ids, len(o.prompt_token_ids)) for o in outs]


# The share of float32's greedy tokens that the quantized model picks too, fed the same
# context (teacher forcing: one early difference does not turn every later token into one).
# Measured on the embedded model (5 prompts x 24 tokens): int8 0.975, int4 0.933 (free-running,
# the toy model's near-ties make the answers part after 2-24 tokens, int4 after 0-4).
@pytest.mark.parametrize("kind, threshold", [("int8", 0.9), ("int4", 0.85)])
def test_greedy_agreement_with_float32_on_the_embedded_model(float_run, kind, threshold):
    llm = LLM(quantization=kind)
    report = llm.engine.runner.model.quantization
    assert report.kind == kind and report.at_load > 0
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
    from app.page import model_summary
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
    from engine.bench import decode_bytes_per_token
    f32, int8 = LLM().engine, LLM(quantization="int8").engine
    report = int8.runner.model.quantization
    drop = decode_bytes_per_token(f32.runner.model, f32.model_config, 0) - \
        decode_bytes_per_token(int8.runner.model, int8.model_config, 0)
    # every quantized Linear's float weight gone, its codes and scales added; the tied LM head
    # keeps the embedding's float matrix, so only its int8 copy (in report.bytes) is added
    quantized_float = sum(p.numel() * 4 for n, p in f32.runner.model.named_parameters()
                          if n.endswith(("proj.weight", "mlp.gate.weight")))
    assert drop == quantized_float - report.bytes
