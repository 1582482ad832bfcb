"""engine/structured.py: xgrammar's mask as the sampling chain's first stage, on a tiny model's
byte-level vocabulary."""
import json

import pytest
import torch

from engine import Constraint, LLM, SamplingParams
from engine.structured import Grammars
from tests.engine_utils import DEVICE


@pytest.fixture(scope="module")
def llm(checkpoint):
    return LLM(checkpoint("llama"), device=DEVICE, dtype="float32", block_size=4)


@pytest.fixture(scope="module")
def grammars(llm):
    e = llm.engine
    return Grammars(e.tokenizer.hf, e.model_config.vocab_size, e.model_config.eos_token_ids)


def control_token(llm) -> int:
    """The byte-level token of byte 0x1c (GPT-2's stand-in character U+011C)."""
    return llm.engine.tokenizer.hf.convert_tokens_to_ids("Ĝ")


def test_a_bounded_json_string_takes_no_raw_control_byte(llm, grammars):
    """xgrammar 0.2.9's rule for a string with maxLength lets raw control bytes in (JSON forbids
    them unescaped): the JSON constraint masks them itself."""
    m = grammars.matcher(Constraint("json_schema", json.dumps({"type": "string", "maxLength": 6})))
    assert m.accept(llm.engine.tokenizer.hf.convert_tokens_to_ids('"'))
    x = m.mask(torch.zeros(llm.engine.model_config.vocab_size))
    assert x[control_token(llm)] == float("-inf")
    assert torch.isfinite(x).sum() > 10  # ordinary characters stay allowed
    regex = grammars.matcher(Constraint("regex", "[\\x01-\\x7f]+"))  # not JSON: control bytes as the pattern says
    assert torch.isfinite(regex.mask(torch.zeros(llm.engine.model_config.vocab_size))[control_token(llm)])


def test_a_choice_is_answered_exactly_and_stops(llm):
    for seed in range(4):
        out = llm.generate([[5, 6, 7]], SamplingParams(temperature=1.5, seed=seed, max_tokens=12,
                                                      structured=Constraint("choice", json.dumps(["red", "blue"]))))[0]
        assert out.text in ("red", "blue") and out.finish_reason == "stop"


def test_a_bad_schema_is_a_value_error_naming_the_field(grammars):
    with pytest.raises(ValueError, match="^guided_regex: the regex does not compile"):
        grammars.matcher(Constraint("regex", "(", "guided_regex"))
