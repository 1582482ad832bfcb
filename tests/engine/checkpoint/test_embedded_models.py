"""The embedded default models in assets/models/: they load with plain
`transformers`, still are the checkpoints the card describes (logit
fingerprint), render the chat roles, and reproduce the card's numbers on a
held-out subset.

The held-out checks need the training corpus: `apt-get install -y fortunes`.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from assets.models import DRAFT_DIR, MODELS_DIR, TARGET_DIR

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

HF_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"]


@pytest.fixture(scope="module")
def models():
    from assets.models.evaluate import load_models

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is enough and never waits on another
    yield load_models()
    torch.set_num_threads(threads)  # the module's own setting: no later test of this worker inherits it


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
    """Loading as stored (bfloat16, as config.json says) works and predicts
    nearly the same: the float32 top token is among the bfloat16 top five.
    dtype="auto" is transformers 5's default; 4.x loads float32 without it."""
    tok = AutoTokenizer.from_pretrained(TARGET_DIR)
    m = AutoModelForCausalLM.from_pretrained(TARGET_DIR, dtype="auto").eval()
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


ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]


def test_tokenizer_config_is_readable_by_transformers_4_and_5():
    """transformers 5 saves extra special tokens as a *list* under
    `extra_special_tokens`; transformers 4 requires a dict there and
    AutoTokenizer.from_pretrained crashes on a list. The shipped config must
    name the role tokens the way both read: `additional_special_tokens`."""
    cfg = json.loads((TARGET_DIR / "tokenizer_config.json").read_text())
    assert isinstance(cfg.get("extra_special_tokens", {}), dict), "list form: transformers 4 cannot load it"
    assert cfg["additional_special_tokens"] == ROLE_TOKENS
    # ... and they are special tokens of tokenizer.json, at the card's ids 3-5.
    added = {t["content"]: t for t in json.loads((TARGET_DIR / "tokenizer.json").read_text())["added_tokens"]}
    for i, name in enumerate(["<|pad|>", "<|bos|>", "<|end|>", *ROLE_TOKENS]):
        assert added[name]["id"] == i and added[name]["special"], name
    assert (cfg["pad_token"], cfg["bos_token"], cfg["eos_token"]) == ("<|pad|>", "<|bos|>", "<|end|>")

    # The installed transformers (4.56+ or 5.x) treats the role tokens as special.
    tok = AutoTokenizer.from_pretrained(TARGET_DIR)
    assert set(ROLE_TOKENS) <= set(tok.all_special_tokens)
    assert [tok.convert_tokens_to_ids(t) for t in ROLE_TOKENS] == [3, 4, 5]
    ids = tok.encode("<|system|>\nBe brief.<|end|>\n<|user|>\nHi!<|end|>\n<|assistant|>\n",
                     add_special_tokens=False)
    assert [i for i in ids if i in tok.all_special_ids] == [3, 2, 4, 2, 5]  # one special token per tag
    assert tok.decode(ids, skip_special_tokens=True) == "\nBe brief.\n\nHi!\n\n"


def test_save_tokenizer_writes_the_committed_config(tmp_path):
    """The committed tokenizer_config.json is what tokenizer.py's save step
    writes (train.py reloads and re-saves the tokenizer with each model)."""
    from assets.models.tokenizer import save_tokenizer

    save_tokenizer(AutoTokenizer.from_pretrained(TARGET_DIR), tmp_path)
    written = json.loads((tmp_path / "tokenizer_config.json").read_text())
    committed = json.loads((TARGET_DIR / "tokenizer_config.json").read_text())
    assert not isinstance(written.get("extra_special_tokens"), list)
    assert (tmp_path / "tokenizer.json").read_bytes() == (TARGET_DIR / "tokenizer.json").read_bytes()
    if int(transformers.__version__.split(".")[0]) >= 5:  # the version the files were written with
        assert written == committed
    else:  # 4.x writes more keys (added_tokens_decoder, ...) but the same values for shared ones
        shared = written.keys() & committed.keys()
        assert {"additional_special_tokens", "chat_template", "tokenizer_class", "eos_token"} <= shared
        assert all(written[k] == committed[k] for k in shared)


def test_paired_comparison_statistics():
    from assets.models.evaluate import paired_comparison, sign_test_p

    assert sign_test_p(5, 5) == 1.0
    assert sign_test_p(0, 10) == pytest.approx(2 / 1024)
    assert sign_test_p(9, 1) == pytest.approx(22 / 1024)
    # Summed NLL and token count per document; the target is better on 3 of 4.
    t = [(10.0, 5), (30.0, 10), (8.0, 4), (12.0, 6)]
    d = [(12.0, 5), (33.0, 10), (7.0, 4), (15.0, 6)]
    r = paired_comparison(t, d, samples=2000, seed=7)
    assert r == paired_comparison(t, d, samples=2000, seed=7)  # deterministic
    assert r["ppl_ratio"] == pytest.approx(math.exp((60 - 67) / 25))
    assert r["target_better_docs"] == 3 and r["draft_better_docs"] == 1 and r["target_better_share"] == 0.75
    assert r["mean_nll_diff_per_doc"] == pytest.approx((-0.4 - 0.3 + 0.25 - 0.5) / 4)
    lo, hi = r["ppl_ratio_ci95"]
    assert lo <= r["ppl_ratio"] <= hi


def test_card_numbers_match_recorded_results(recorded):
    card = (MODELS_DIR / "README.md").read_text()
    p = recorded["perplexity"]
    for value in (p["target"], p["draft"]):
        assert f"{value:.2f}" in card
    assert f"{100 * recorded['speculative']['acceptance_rate']:.1f}%" in card
    assert f"{100 * recorded['min_expert_load']:.1f}%" in card
    # The paired target-vs-draft comparison: recorded, consistent, and in the card.
    c = recorded["paired_target_vs_draft"]
    assert c["docs"] == recorded["heldout_docs"]
    assert c["ppl_ratio"] == pytest.approx(p["target"] / p["draft"], rel=1e-9)
    assert c["log_ppl_ratio"] == pytest.approx(math.log(c["ppl_ratio"]), rel=1e-9)
    lo, hi = c["ppl_ratio_ci95"]
    assert lo < c["ppl_ratio"] < hi < 1  # the target is better beyond document-resampling noise
    assert c["mean_nll_diff_per_doc_ci95"][1] < 0
    assert c["target_better_docs"] + c["draft_better_docs"] <= c["docs"]
    assert c["target_better_share"] == c["target_better_docs"] / c["docs"] > 0.5
    assert c["bootstrap"]["samples"] >= 1000
    for value in (c["ppl_ratio"], lo, hi):
        assert f"{value:.4f}" in card
    assert f"{c['target_better_docs']} of {c['docs']} ({100 * c['target_better_share']:.1f}%)" in card
    # The quality bar, on the full held-out split.
    assert p["target"] < 0.9 * p["draft"] < 0.9 * p["unigram"]
    assert p["draft"] < p["unigram"] / 3
    assert recorded["min_expert_load"] >= 0.03
    assert recorded["speculative"]["k"] == 4 and recorded["speculative"]["acceptance_rate"] >= 0.40
    assert recorded["english_word_rate"]["target"] >= 0.8


@pytest.mark.slow  # a held-out evaluation of both models
def test_quick_evaluation_reproduces_recorded_numbers(models, recorded):
    from assets.models.evaluate import quick_eval

    got, want = quick_eval(models), recorded["quick"]
    assert got["docs"] == want["docs"] > 0
    assert got["target_ppl"] == pytest.approx(want["target_ppl"], rel=1e-3)
    assert got["draft_ppl"] == pytest.approx(want["draft_ppl"], rel=1e-3)
    # Per-document comparison; a document whose two NLLs nearly tie may flip.
    assert got["target_better_share"] == pytest.approx(want["target_better_share"], abs=1 / got["docs"] + 1e-9)
    assert got["min_expert_load"] == pytest.approx(want["min_expert_load"], abs=1e-3)
    assert got["acceptance_rate"] == pytest.approx(want["acceptance_rate"], abs=0.02)
    assert got["target_ppl"] < got["draft_ppl"]
