"""Penalties, biases and min_tokens (engine/penalties.py) against transformers' logits
processors on the same logits, OpenAI's formula for frequency and presence, greedy
generation against transformers' generate, and the stages the trace shows."""
import pytest
import torch
from transformers.generation.logits_process import (MinNewTokensLengthLogitsProcessor, MinPLogitsWarper,
                                                    RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor)

from engine import LLM, SamplingParams
from engine.penalties import History, adjust_stages
from engine.sampler import explain, filter_stages, sample
from tests.engine_utils import DEVICE
from tests.tiny import load_reference

V = 64
gen = torch.Generator().manual_seed(0)
LOGITS = torch.randn(V, generator=gen) * 3
PROMPT = torch.randint(0, V, (12,), generator=gen).tolist()
OUTPUT = [5, 9, 5, 5, 40, 9]


def stage(params, name, output=OUTPUT, stops=(2,)):
    return adjust_stages(LOGITS, params, History(PROMPT, list(output), list(stops)))[name]


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_is_transformers(penalty):
    ids = torch.tensor([PROMPT + OUTPUT])
    expected = RepetitionPenaltyLogitsProcessor(penalty)(ids, LOGITS[None].clone())[0]
    torch.testing.assert_close(stage(SamplingParams(repetition_penalty=penalty), "repetition_penalty"), expected)


def test_logit_bias_is_transformers_sequence_bias():
    bias = {3: 100.0, 7: -100.0, 30: 2.5}
    expected = SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()])(torch.tensor([PROMPT]),
                                                                               LOGITS[None].clone())[0]
    torch.testing.assert_close(stage(SamplingParams(logit_bias=bias), "logit_bias"), expected)


@pytest.mark.parametrize("done", [0, 3, 5, 6])
def test_min_tokens_is_transformers(done):
    eos = [2, 11]
    ids = torch.tensor([PROMPT + OUTPUT[:done]])
    expected = MinNewTokensLengthLogitsProcessor(len(PROMPT), 5, eos)(ids, LOGITS[None].clone())[0]
    got = adjust_stages(LOGITS, SamplingParams(min_tokens=5), History(PROMPT, OUTPUT[:done], eos))
    torch.testing.assert_close(got.get("min_tokens", LOGITS), expected)
    assert ("min_tokens" in got) == (done < 5)  # once reached, the stage is gone


def test_min_p_is_transformers():
    p = SamplingParams(min_p=0.2)
    expected = MinPLogitsWarper(0.2)(torch.tensor([PROMPT]), LOGITS[None].clone())[0]
    assert torch.equal(filter_stages(LOGITS, p)["min_p"] > float("-inf"), expected > float("-inf"))


def test_frequency_and_presence_are_openais_formula():
    """logit - count * frequency_penalty - (count > 0) * presence_penalty, over the output only."""
    p = SamplingParams(frequency_penalty=0.5, presence_penalty=1.5)
    got = adjust_stages(LOGITS, p, History(PROMPT, OUTPUT, []))
    counts = torch.zeros(V)
    for t in OUTPUT:
        counts[t] += 1
    torch.testing.assert_close(got["frequency_penalty"], LOGITS - 0.5 * counts)
    torch.testing.assert_close(got["presence_penalty"], LOGITS - 0.5 * counts - 1.5 * (counts > 0).float())
    untouched = [t for t in PROMPT if t not in OUTPUT]  # the prompt does not count (OpenAI's meaning)
    torch.testing.assert_close(got["presence_penalty"][untouched], LOGITS[untouched])


def test_stages_run_in_vllms_order_and_off_knobs_add_none():
    p = SamplingParams(temperature=0.7, min_tokens=9, logit_bias={4: 3.0}, repetition_penalty=1.2,
                       presence_penalty=0.4)
    names = list(adjust_stages(LOGITS, p, History(PROMPT, OUTPUT, [2])))
    assert names == ["min_tokens", "logit_bias", "repetition_penalty", "presence_penalty"]
    assert adjust_stages(LOGITS, SamplingParams(), History(PROMPT, OUTPUT, [2])) == {}


def test_the_draw_reads_the_adjusted_logits():
    best = int(torch.argmin(LOGITS))
    for temperature in (0.0, 1.0):
        p = SamplingParams(temperature=temperature, logit_bias={best: 100.0}, seed=1)
        g = torch.Generator().manual_seed(1)
        assert sample(LOGITS[None], [p], [g], None, [History(PROMPT, OUTPUT, [])]) == [best]


def test_explain_shows_what_each_stage_moved():
    best = int(torch.argmin(LOGITS))
    p = SamplingParams(temperature=0, logit_bias={best: 100.0}, repetition_penalty=2.0, min_tokens=3)
    stages = {}
    token = sample(LOGITS[None], [p], [None], stages, [History(PROMPT, OUTPUT[:1], [2])])[0]
    info = explain(LOGITS, p, token, 5, stages[0])
    assert list(info["stages"]) == ["logits", "min_tokens", "logit_bias", "repetition_penalty"]
    assert info["stages"]["logit_bias"]["moved"] == 1 and info["stages"]["logit_bias"]["changes"] == [[best, 100.0]]
    assert info["stages"]["min_tokens"]["changes"] == [[2, None]]  # masked to -inf
    rep = info["stages"]["repetition_penalty"]
    assert rep["moved"] == len(set(PROMPT + OUTPUT[:1]))
    assert all(t in info["candidates"] for t, _ in rep["changes"])  # the moved tokens are shown, with texts
    assert info["token_id"] == best and info["params"]["logit_bias"] == {str(best): 100.0}
    assert info["params"]["repetition_penalty"] == 2.0 and "presence_penalty" not in info["params"]


@pytest.fixture(scope="module")
def pair(checkpoint):
    path = checkpoint("llama")
    return LLM(path, device=DEVICE, dtype="float32", block_size=4), load_reference(path)


def test_greedy_with_repetition_penalty_matches_transformers_generate(pair):
    llm, ref = pair
    prompt = [5, 17, 17, 42, 8, 17, 99, 23]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.8,
                                                ignore_eos=True))[0]
    with torch.no_grad():
        expected = ref.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, repetition_penalty=1.8,
                                min_new_tokens=12)[0, len(prompt):].tolist()
    assert out.token_ids == expected


def test_a_request_with_a_bias_answers_the_biased_token(pair):
    llm, _ = pair
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.9, seed=3, max_tokens=4, logit_bias={77: 100},
                                                  ignore_eos=True))[0]
    assert out.token_ids == [77] * 4
    free = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, frequency_penalty=2.0,
                                                   presence_penalty=2.0, ignore_eos=True))[0]
    plain = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert len(set(free.token_ids)) >= len(set(plain.token_ids))
