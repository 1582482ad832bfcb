"""The embedded default models in assets/models/: they load with plain
`transformers`, still are the checkpoints the card describes (logit
fingerprint), render the chat roles, and reproduce the card's numbers on a
held-out subset.

The held-out checks need the training corpus: `apt-get install -y fortunes`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `assets`
from assets.models import DRAFT_DIR, MODELS_DIR, TARGET_DIR

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

HF_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"]


@pytest.fixture(scope="module")
def models():
    from assets.models.evaluate import load_models

    torch.set_num_threads(1)  # tiny models: one thread is enough and never waits on another
    return load_models()


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads((MODELS_DIR / "eval_results.json").read_text())


def test_directories_are_complete_and_small():
    for d in (TARGET_DIR, DRAFT_DIR):
        for name in HF_FILES:
            assert (d / name).is_file(), f"missing {d / name}"
    total = sum(f.stat().st_size for f in MODELS_DIR.rglob("*") if f.is_file())
    assert total <= 20 * 1024 * 1024, f"assets/models is {total / 2**20:.1f} MiB"
    # Both models share one tokenizer.
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (TARGET_DIR / name).read_bytes() == (DRAFT_DIR / name).read_bytes(), name


def test_architectures(models):
    t, d = models.target.config, models.draft.config
    assert type(models.target).__name__ == "MixtralForCausalLM"
    assert type(models.draft).__name__ == "LlamaForCausalLM"
    assert t.num_local_experts == 8 and t.num_experts_per_tok == 2
    assert t.num_attention_heads > t.num_key_value_heads  # grouped-query attention
    assert t.vocab_size == d.vocab_size == len(models.tok)
    assert sum(p.numel() for p in models.draft.parameters()) < sum(p.numel() for p in models.target.parameters())
    for cfg in (t, d):
        assert cfg.eos_token_id == models.tok.convert_tokens_to_ids("<|end|>")
        assert cfg.bos_token_id == models.tok.convert_tokens_to_ids("<|bos|>")
    assert models.target.generation_config.eos_token_id == models.tok.eos_token_id


def test_saved_keys_are_classic_per_expert_layout():
    from safetensors import safe_open

    with safe_open(TARGET_DIR / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert "model.layers.0.block_sparse_moe.gate.weight" in keys
    for e in range(8):
        for w in ("w1", "w2", "w3"):
            assert f"model.layers.3.block_sparse_moe.experts.{e}.{w}.weight" in keys


def test_default_dtype_load_works():
    """Loading as-is (bfloat16, as config.json says) works and predicts nearly
    the same: the float32 top token is among the bfloat16 top five."""
    tok = AutoTokenizer.from_pretrained(TARGET_DIR)
    m = AutoModelForCausalLM.from_pretrained(TARGET_DIR).eval()
    assert m.dtype == torch.bfloat16
    fp = json.loads((MODELS_DIR / "fingerprint.json").read_text())["target"]
    with torch.no_grad():
        last = m(torch.tensor([fp["input_ids"]])).logits[0, -1].float()
    assert fp["last_top5_ids"][0] in last.topk(5).indices.tolist()


@pytest.mark.parametrize("which", ["target", "draft"])
def test_logits_fingerprint(models, which):
    from assets.models.evaluate import fingerprint

    expected = json.loads((MODELS_DIR / "fingerprint.json").read_text())[which]
    got = fingerprint(getattr(models, which), models.tok)
    assert got["input_ids"] == expected["input_ids"]
    assert got["argmax_ids"] == expected["argmax_ids"]
    assert got["last_top5_ids"] == expected["last_top5_ids"]
    for key in ("last_top5_logits", "logits_0_to_7_at_last"):
        assert got[key] == pytest.approx(expected[key], abs=1e-4), key
    assert got["mean_logit"] == pytest.approx(expected["mean_logit"], abs=1e-4)


def test_chat_template_renders_roles():
    tok = AutoTokenizer.from_pretrained(TARGET_DIR)
    cfg = json.loads((TARGET_DIR / "tokenizer_config.json").read_text())
    assert "chat_template" in cfg and cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "A joke?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|bos|><|system|>\nBe brief.<|end|>\n<|user|>\nHi!<|end|>\n"
                    "<|assistant|>\nHello.<|end|>\n<|user|>\nA joke?<|end|>\n<|assistant|>\n")
    no_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert not no_prompt.endswith("<|assistant|>\n")
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    specials = {t: tok.convert_tokens_to_ids(t) for t in ("<|bos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")}
    assert ids[0] == specials["<|bos|>"] and ids.count(specials["<|bos|>"]) == 1
    for name in ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>"):
        assert specials[name] in ids and specials[name] < 8  # one special token each, not pieces
    assert tok.decode(ids) == text


def test_card_numbers_match_recorded_results(recorded):
    card = (MODELS_DIR / "README.md").read_text()
    p = recorded["perplexity"]
    for value in (p["target"], p["draft"]):
        assert f"{value:.2f}" in card
    assert f"{100 * recorded['speculative']['acceptance_rate']:.1f}%" in card
    assert f"{100 * recorded['min_expert_load']:.1f}%" in card
    # The quality bar, on the full held-out split.
    assert p["target"] < 0.9 * p["draft"] < 0.9 * p["unigram"]
    assert p["draft"] < p["unigram"] / 3
    assert recorded["min_expert_load"] >= 0.03
    assert recorded["speculative"]["k"] == 4 and recorded["speculative"]["acceptance_rate"] >= 0.40
    assert recorded["english_word_rate"]["target"] >= 0.8


def test_quick_evaluation_reproduces_recorded_numbers(models, recorded):
    from assets.models.evaluate import quick_eval

    got, want = quick_eval(models), recorded["quick"]
    assert got["docs"] == want["docs"] > 0
    assert got["target_ppl"] == pytest.approx(want["target_ppl"], rel=1e-3)
    assert got["draft_ppl"] == pytest.approx(want["draft_ppl"], rel=1e-3)
    assert got["min_expert_load"] == pytest.approx(want["min_expert_load"], abs=1e-3)
    assert got["acceptance_rate"] == pytest.approx(want["acceptance_rate"], abs=0.02)
    assert got["target_ppl"] < got["draft_ppl"]
