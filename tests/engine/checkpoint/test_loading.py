"""Checkpoint loading: shards, dtypes, the hub path, and one clear error per failure."""
import json
import shutil

import pytest
import torch

from engine import LLM, ModelLoadError, SamplingParams, UnsupportedModelError
from engine.checkpoint.resolve import resolve_model_path
from engine.forward import prompt_logits
from engine.kernels import cpu as cpu_kernels
from engine.layers.linear import Linear
from tests.engine_utils import DEVICE
from tests.tiny import make_checkpoint

PROMPT = list(range(5, 30))


@pytest.fixture()
def copy_of(checkpoint, tmp_path):
    def make(arch):
        dst = tmp_path / arch
        shutil.copytree(checkpoint(arch), dst)
        return dst
    return make


def test_sharded_checkpoint_with_index(tmp_path, checkpoint):
    sharded = make_checkpoint("qwen2_moe", tmp_path / "sharded", max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    whole = LLM(checkpoint("qwen2_moe"), device=DEVICE)
    split = LLM(sharded, device=DEVICE)
    torch.testing.assert_close(prompt_logits(split.engine, PROMPT, 25), prompt_logits(whole.engine, PROMPT, 25))


@pytest.mark.parametrize("dtype,tol", [("bfloat16", 0.15), ("float16", 0.02)])
def test_half_precision_dtypes(checkpoint, dtype, tol):
    ref = prompt_logits(LLM(checkpoint("qwen3"), device=DEVICE, dtype="float32").engine, PROMPT, 25)
    llm = LLM(checkpoint("qwen3"), device=DEVICE, dtype=dtype)
    runner = llm.engine.runner
    # the CPU's C kernels keep the weights in 16 bits and compute (and keep the KV pool) in float32
    kernels = runner.device.type == "cpu" and cpu_kernels.available()
    assert runner.kv_cache.dtype == (torch.float32 if kernels else getattr(torch, dtype))
    if kernels:
        assert all(m.blocked.dtype == getattr(torch, dtype) for m in runner.model.modules() if isinstance(m, Linear))
    got = prompt_logits(llm.engine, PROMPT, 25)
    assert (got - ref).abs().max() < tol * ref.abs().max()
    assert len(llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0].token_ids) == 8


def test_hub_id_resolves_from_the_hub_cache(checkpoint, tmp_path, monkeypatch):
    # The layout huggingface_hub writes; offline mode must find the snapshot there.
    repo = tmp_path / "hub" / "models--tokentrace--tiny-llama"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(checkpoint("llama"), repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    path = resolve_model_path("tokentrace/tiny-llama")
    assert path == repo / "snapshots" / commit
    assert LLM("tokentrace/tiny-llama", device=DEVICE).engine.model_config.family == "llama"
    # Ids without an owner (like "gpt2") are hub ids too, not missing local paths.
    bare = tmp_path / "hub" / "models--tiny-llama"
    shutil.copytree(repo, bare)
    assert resolve_model_path("tiny-llama") == bare / "snapshots" / commit


def test_unreachable_hub_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError, match="could not get 'nobody/no-such-model' from the Hugging Face hub"):
        LLM("nobody/no-such-model", device=DEVICE)


def test_missing_directory():
    with pytest.raises(ModelLoadError, match="model directory not found: ./nowhere/at/all"):
        LLM("./nowhere/at/all")


def test_unsupported_architecture(copy_of):
    path = copy_of("llama")
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="unsupported architecture.*GPT2LMHeadModel.*supported: LlamaForCausalLM"):
        LLM(path)


def test_unsupported_rope_scaling(copy_of):
    path = copy_of("mistral")
    cfg = json.loads((path / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="unsupported RoPE scaling 'yarn'"):
        LLM(path)


@pytest.mark.parametrize("remove,message", [
    ("config.json", "missing config.json"),
    ("model.safetensors", r"missing \*.safetensors weights"),
    ("tokenizer.json", "missing tokenizer files"),
])
def test_missing_files(copy_of, remove, message):
    path = copy_of("llama")
    (path / remove).unlink()
    with pytest.raises(ModelLoadError, match=message):
        LLM(path)


def test_missing_shard(tmp_path):
    path = make_checkpoint("mistral", tmp_path / "m", max_shard_size="100KB")
    victim = sorted(path.glob("*.safetensors"))[-1]
    victim.unlink()
    with pytest.raises(ModelLoadError, match=f"missing weight shards.*{victim.name}"):
        LLM(path)


def test_truncated_weights(copy_of):
    path = copy_of("llama")
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="cannot read"):
        LLM(path)


def test_missing_tensor_is_named(copy_of):
    from safetensors.torch import load_file, save_file
    path = copy_of("mixtral")
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"lacks weights for: model.layers.1.mlp.experts_gate_up"):
        LLM(path)


def test_device_and_dtype_errors(checkpoint):
    with pytest.raises(ValueError, match="unsupported dtype 'int8'"):
        LLM(checkpoint("llama"), dtype="int8")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            LLM(checkpoint("llama"), device="cuda")


def test_loading_reports_progress(checkpoint):
    seen = []
    LLM(checkpoint("olmoe"), device=DEVICE, progress=lambda done, total, what: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1] > 10


@pytest.mark.parametrize("arch", ["mistral", "qwen3_moe", "olmoe"])
def test_config_with_only_model_type(copy_of, arch):
    """A config.json without `architectures` loads as transformers loads it: by model_type."""
    from tests.tiny import load_reference
    path = copy_of(arch)
    cfg = json.loads((path / "config.json").read_text())
    del cfg["architectures"]
    (path / "config.json").write_text(json.dumps(cfg))
    llm = LLM(path, device=DEVICE, dtype="float32")
    with torch.no_grad():
        expected = load_reference(path)(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(prompt_logits(llm.engine, PROMPT, 25), expected, atol=2e-4, rtol=1e-4)


def test_tied_checkpoint_with_only_lm_head(copy_of):
    """Tied embeddings stored once, as lm_head.weight: that matrix is the embedding too
    (transformers fills the shared parameter from either name)."""
    from safetensors.torch import load_file, save_file

    from tests.tiny import load_reference
    path = copy_of("llama")
    tensors = load_file(str(path / "model.safetensors"))
    tensors["lm_head.weight"] = tensors.pop("model.embed_tokens.weight")
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    llm = LLM(path, device=DEVICE, dtype="float32")
    ref = load_reference(path)
    torch.testing.assert_close(ref.model.embed_tokens.weight, tensors["lm_head.weight"])
    with torch.no_grad():
        expected = ref(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(prompt_logits(llm.engine, PROMPT, 25), expected, atol=2e-4, rtol=1e-4)
