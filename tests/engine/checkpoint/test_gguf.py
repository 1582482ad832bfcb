"""GGUF files (llama.cpp's format) load in the engine. Tiny random models are written with
the gguf package's own writer the way llama.cpp's converter writes them (renamed tensors,
Llama's Q/K rows permuted, stacked experts, Gemma norms + 1, quantized blocks, a byte-level
BPE vocabulary and a chat template), then checked against transformers loading the same file."""
import math

import numpy as np
import pytest
import torch

from engine import LLM, ModelLoadError, SamplingParams
from engine.checkpoint.resolve import resolve_model_path
from engine.forward import prompt_logits
from tests.engine_utils import DEVICE
from tests.gguf_writer import Q, tiny_model, write_gguf  # skips these tests without the gguf package
from tests.tiny import VOCAB, save_tokenizer

gguf = pytest.importorskip("gguf")
PROMPT = torch.randint(4, 300, (21,), generator=torch.Generator().manual_seed(11)).tolist()


@pytest.fixture(scope="module", autouse=True)
def _own_cache(tmp_path_factory):
    """Converted tokenizers are saved in the model cache: keep these tests' files out of the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOKENTRACE_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    save_tokenizer(path)
    return path


def hf_gguf_reference(path, config=None):
    from transformers import AutoModelForCausalLM
    kwargs = {"config": config} if config is not None else {}
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                attn_implementation="eager", **kwargs).eval()


def hf_greedy(ref, n: int) -> list[int]:
    with torch.no_grad():
        return ref.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(PROMPT):].tolist()


def assert_matches(llm: LLM, ref, n_new: int = 16) -> None:
    with torch.no_grad():
        expected = ref(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(prompt_logits(llm.engine, PROMPT, len(PROMPT)), expected, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(prompt_logits(llm.engine, PROMPT, 5), expected, atol=2e-4, rtol=1e-4)
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=n_new, ignore_eos=True))[0]
    assert out.token_ids == hf_greedy(ref, n_new)


# --- the engine against transformers on the same file ------------------------------

# id -> (config class, config kwargs, quantization of the matrices)
CASES = {
    "llama-f32-untied": ("LlamaConfig", dict(tie_word_embeddings=False), Q.F32),
    "llama-q4_0-tied": ("LlamaConfig", dict(tie_word_embeddings=True), Q.Q4_0),
    "llama-q4_k": ("LlamaConfig", dict(tie_word_embeddings=False, hidden=256, inter=256), Q.Q4_K),
    "llama-q5_k": ("LlamaConfig", dict(tie_word_embeddings=True, hidden=256, inter=256), Q.Q5_K),
    "qwen2-f16": ("Qwen2Config", dict(), Q.F16),
    "qwen2-q5_0": ("Qwen2Config", dict(), Q.Q5_0),
    # transformers reads no head_dim from a qwen3 file: keep Qwen3Config's default (128)
    "qwen3-bf16": ("Qwen3Config", dict(), Q.BF16),
    "qwen3-q6_k": ("Qwen3Config", dict(hidden=256, inter=256), Q.Q6_K),
    "qwen2moe-q4_1": ("Qwen2MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                             shared_expert_intermediate_size=64, norm_topk_prob=False), Q.Q4_1),
    "qwen3moe-q8_0": ("Qwen3MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                             norm_topk_prob=True, head_dim=16), Q.Q8_0),
}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory, tok_dir):
    cache = {}

    def get(case: str):
        if case not in cache:
            cls, extra, qtype = CASES[case]
            model = tiny_model(cls, seed=len(cache), **extra)
            path = write_gguf(model, tok_dir, tmp_path_factory.mktemp(case) / f"{case}.gguf", qtype)
            cache[case] = (path, model)
        return cache[case]
    return get


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_matches_transformers(gguf_file, case):
    path, source = gguf_file(case)
    moe = "moe" in case  # transformers' GGUF config omits the expert sizes: give it the source's
    ref = hf_gguf_reference(path, source.config if moe else None)
    llm = LLM(path, device=DEVICE, dtype="float32", block_size=4)
    assert_matches(llm, ref)
    cfg = llm.engine.model_config
    assert cfg.tie_word_embeddings == source.config.tie_word_embeddings
    if moe:
        assert cfg.moe_intermediate_size == 32 and cfg.num_experts == 4
        assert cfg.moe_layers == [True] * 3
        assert cfg.norm_topk_prob == source.config.norm_topk_prob
        assert cfg.shared_expert_intermediate_size == getattr(source.config, "shared_expert_intermediate_size", 0)


def test_unquantized_gguf_equals_the_source_model(gguf_file):
    """F32: no quantization error, so the GGUF must give the original model's logits."""
    path, source = gguf_file("llama-f32-untied")
    assert_matches(LLM(path, device=DEVICE, dtype="float32"), source)


def test_moe_file_with_dense_layers(tmp_path, tok_dir):
    """A layer without a router is a dense MLP (transformers' GGUF loader maps no dense
    tensors for qwen2moe, so the reference is the source model)."""
    source = tiny_model("Qwen2MoeConfig", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        shared_expert_intermediate_size=48, mlp_only_layers=[1], norm_topk_prob=False)
    llm = LLM(write_gguf(source, tok_dir, tmp_path / "mixed.gguf"), device=DEVICE, dtype="float32")
    assert llm.engine.model_config.moe_layers == [True, False, True]
    assert llm.engine.model_config.shared_expert_intermediate_size == 48
    assert_matches(llm, source)


def test_mixtral_style_llama_with_experts(tmp_path, tok_dir):
    """llama.cpp converts Mixtral as a `llama` file with experts (transformers' GGUF loader
    does not read those): the reference is the source model."""
    source = tiny_model("MixtralConfig", num_local_experts=4, num_experts_per_tok=2)
    path = write_gguf(source, tok_dir, tmp_path / "mixtral.gguf")
    llm = LLM(path, device=DEVICE, dtype="float32")
    assert llm.engine.model_config.architecture == "MixtralForCausalLM"
    assert llm.engine.model_config.moe_layers == [True] * 3
    assert_matches(llm, source)


def test_llama3_rope_scaling_from_rope_freqs(tmp_path, tok_dir):
    """llama.cpp stores Llama 3's RoPE scaling as rope_freqs.weight (one divisor per frequency)."""
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32}
    source = tiny_model("LlamaConfig", rope_scaling=rope)
    # convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors
    dim = 16
    freqs = 1.0 / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < 32 / 4.0:
            factors.append(1.0)
        elif wavelen > 32 / 1.0:
            factors.append(8.0)
        else:
            smooth = (32 / wavelen - 1.0) / (4.0 - 1.0)
            factors.append(1 / ((1 - smooth) / 8.0 + smooth))
    path = write_gguf(source, tok_dir, tmp_path / "llama3.gguf",
                      extra_tensors={"rope_freqs.weight": np.array(factors, dtype=np.float32)})
    llm = LLM(path, device=DEVICE, dtype="float32")
    assert llm.engine.model_config.rope_scaling["rope_type"] == "llama3"
    assert_matches(llm, source)


def test_gemma3_matches_transformers(tmp_path, tok_dir):
    """Gemma 3: the config (sliding pattern, local RoPE base, norms stored as 1 + w), every
    tensor, and the model's outputs as transformers reads the file."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from engine.checkpoint.gguf import close_gguf, read_config, read_tensors

    source = tiny_model("Gemma3TextConfig", layers=7, head_dim=256, sliding_window=8, query_pre_attn_scalar=256)
    path = write_gguf(source, tok_dir, tmp_path / "gemma3.gguf", Q.Q8_0)
    ours = read_config(path)
    theirs = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    rebuilt = AutoConfig.for_model(**ours)  # our dict, read by transformers' own config class
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "hidden_activation", "rms_norm_eps", "sliding_window",
                "layer_types", "rope_parameters", "query_pre_attn_scalar", "final_logit_softcapping",
                "tie_word_embeddings", "bos_token_id", "eos_token_id"):
        assert getattr(rebuilt, key) == getattr(theirs, key), key
    assert rebuilt.model_type == theirs.model_type == "gemma3_text"
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(theirs)
    expected = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)["tensors"]
    _, tensors = read_tensors(path)
    got = dict(tensors)
    close_gguf(path)
    assert got.keys() == expected.keys()
    for name, t in got.items():
        torch.testing.assert_close(t, expected[name], atol=1e-6, rtol=0, msg=name)
    # the norms really were offset: the source's (un-offset) values come back
    torch.testing.assert_close(got["model.norm.weight"], source.model.norm.weight)
    llm = LLM(path, device=DEVICE, dtype="float32", block_size=4)
    assert llm.engine.model_config.sliding_windows == [8] * 5 + [None, 8]
    assert_matches(llm, hf_gguf_reference(path))


# --- tokenizer ---------------------------------------------------------------------

def test_tokenizer_and_chat_template_from_gguf(gguf_file, tok_dir):
    from transformers import AutoTokenizer

    path, _ = gguf_file("llama-q4_0-tied")
    llm = LLM(path, device=DEVICE)
    ours = llm.tokenizer
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    original = AutoTokenizer.from_pretrained(str(tok_dir))
    text = "The quick brown fox: Héllo wörld, naïve café 日本語 ✓ 🙂</s>"
    assert ours.encode(text) == theirs.encode(text) == original.encode(text)
    assert ours.decode(ours.encode(text), skip_special_tokens=False) == text
    messages = [{"role": "user", "content": "Héllo fox"}, {"role": "assistant", "content": "dog"},
                {"role": "user", "content": "lazy?"}]
    prompt = ours.apply_chat_template(messages)
    assert prompt == theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) \
        == original.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt.startswith("<s><|user|>Héllo fox</s>") and prompt.endswith("<|assistant|>")
    assert ours.encode_chat(messages) == original.encode(prompt, add_special_tokens=False)
    assert {0, 1, 2, 3} <= ours.special_ids
    assert llm.engine.model_config.eos_token_ids == [1] and llm.engine.model_config.bos_token_id == 0
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out.token_ids) == 4


def test_gguf_tokenizer_is_converted_once(gguf_file, monkeypatch):
    from engine.tokenizer import Tokenizer
    import transformers

    path, _ = gguf_file("qwen2-f16")
    Tokenizer(path)
    calls = []
    real = transformers.AutoTokenizer.from_pretrained
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: calls.append(a) or real(*a, **k))
    assert Tokenizer(path).encode("fox") == Tokenizer(path).encode("fox")
    assert calls == []


def test_gguf_tokenizer_is_kept_on_disk_and_reloads_the_same(gguf_file, tmp_path, monkeypatch):
    """A second start-up (a new process: the in-memory cache is empty) loads the saved
    tokenizer.json instead of converting the vocabulary again, and it behaves the same."""
    from engine import tokenizer as tk
    import transformers

    monkeypatch.setenv("TOKENTRACE_CACHE", str(tmp_path / "cache"))
    path, _ = gguf_file("llama-q4_0-tied")
    monkeypatch.setattr(tk, "_gguf_tokenizers", {})
    converted = tk.Tokenizer(path)
    (saved,) = (tmp_path / "cache" / ".tokenizers").iterdir()
    assert (saved / "tokenizer.json").is_file()
    monkeypatch.setattr(tk, "_gguf_tokenizers", {})
    calls = []
    real = transformers.AutoTokenizer.from_pretrained
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: calls.append(k.get("gguf_file")) or real(*a, **k))
    reloaded = tk.Tokenizer(path)
    assert calls == [None]  # read from the saved folder, no gguf_file conversion
    text = "The quick brown fox: Héllo wörld, naïve café 日本語 ✓ 🙂</s>"
    messages = [{"role": "user", "content": "Héllo fox"}]
    assert reloaded.encode(text) == converted.encode(text)
    assert reloaded.encode_chat(messages) == converted.encode_chat(messages)
    assert reloaded.special_ids == converted.special_ids and reloaded.vocab_size == converted.vocab_size


def test_gguf_without_chat_template(tmp_path, tok_dir):
    source = tiny_model("Qwen3Config", head_dim=16)
    path = write_gguf(source, tok_dir, tmp_path / "base.gguf", Q.Q8_0, chat_template=False)
    llm = LLM(path, device=DEVICE)
    assert not llm.tokenizer.has_chat_template
    with pytest.raises(ValueError, match="no chat template"):
        llm.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


# --- paths and errors --------------------------------------------------------------

def test_resolve_gguf_paths(gguf_file, tmp_path):
    path, _ = gguf_file("qwen2-f16")
    assert resolve_model_path(str(path)) == path
    with pytest.raises(ModelLoadError, match="model file not found: .*missing.gguf"):
        resolve_model_path(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelLoadError, match="model file not found: missing.gguf"):
        resolve_model_path("missing.gguf")  # not mistaken for a hub id
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\0" * 64)
    with pytest.raises(ModelLoadError, match="not a checkpoint directory or GGUF file"):
        resolve_model_path(str(other))


def test_gguf_without_suffix_is_recognised(gguf_file, tmp_path):
    """Ollama keeps its models as blobs named by hash, with no .gguf suffix."""
    import shutil
    path, _ = gguf_file("qwen2-f16")
    blob = tmp_path / "sha256-0123abcd"
    shutil.copy(path, blob)
    llm = LLM(blob, device=DEVICE)
    assert llm.engine.model_config.family == "qwen2"


@pytest.mark.parametrize("damage,message", [
    ("truncate", "cannot read GGUF file .* \\(corrupt or truncated\\?\\)"),
    ("garbage", "cannot read GGUF file .* \\(corrupt or truncated\\?\\): GGUF magic invalid"),
    ("empty", "cannot read GGUF file"),
])
def test_corrupt_gguf_is_one_clear_error(gguf_file, tmp_path, damage, message):
    path, _ = gguf_file("qwen2-f16")
    bad = tmp_path / "bad.gguf"
    data = path.read_bytes()
    bad.write_bytes({"truncate": data[: len(data) * 2 // 3], "garbage": b"not a gguf file" * 100,
                     "empty": b""}[damage])
    with pytest.raises(ModelLoadError, match=message) as e:
        LLM(bad, device=DEVICE)
    assert "\n" not in str(e.value)


def test_unsupported_gguf_architecture(tmp_path, tok_dir):
    source = tiny_model("LlamaConfig")
    path = write_gguf(source, tok_dir, tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(ModelLoadError, match=r"unsupported GGUF architecture 'gpt2' \(general.architecture\)"):
        LLM(path, device=DEVICE)


def test_unsupported_gguf_quantization(tmp_path, tok_dir):
    """Q8_K (llama.cpp's intermediate type for dot products) has no dequantizer."""
    source = tiny_model("LlamaConfig", hidden=256, inter=256)
    path = write_gguf(source, tok_dir, tmp_path / "q8k.gguf")
    # the same file with the output matrix stored as Q8_K (one 292-byte block per row of 256)
    w = gguf.GGUFWriter(str(tmp_path / "q8k2.gguf"), "llama")
    reader = gguf.GGUFReader(path)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        w.add_key_value(field.name, field.contents(), field.types[0],
                        field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        if t.name == "output.weight":
            w.add_tensor(t.name, np.zeros((VOCAB, 292), dtype=np.uint8), raw_dtype=Q.Q8_K)
        else:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="unsupported GGUF quantization type Q8_K .*output.weight"):
        LLM(tmp_path / "q8k2.gguf", device=DEVICE)
