"""OutputProcessor.surely_ends: whether a step's tokens end their request, known before they are
appended (the trace computes that step's captures and lens at once: StepTrace.last_step). Held
against what appending them says (stop_reason): never an end that does not come; every end but
a stop string's (and a grammar's) foreseen."""
from __future__ import annotations

import random

import pytest

from engine.llm_engine import DEFAULT_MODEL
from engine.output_processor import OutputProcessor
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.tokenizer import IncrementalDetokenizer, Tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(DEFAULT_MODEL)


def seq_of(tokenizer, params: SamplingParams, prompt: list[int]) -> Sequence:
    return Sequence("r", list(prompt), params, IncrementalDetokenizer.start(tokenizer, prompt),
                    token_ids=list(prompt))


@pytest.mark.parametrize("seed", range(6))
def test_a_foreseen_end_comes_and_every_end_but_a_stop_strings_is_foreseen(tokenizer, seed):
    rng = random.Random(seed)
    eos, vocab = 2, 40
    out = OutputProcessor([eos], max_model_len=rng.choice([12, 40]), emit=lambda e: None)
    params = SamplingParams(max_tokens=rng.randint(1, 20), ignore_eos=rng.random() < 0.3,
                            stop_token_ids=rng.sample(range(3, vocab), 2), stop=["zz"] if seed % 2 else [])
    seq = seq_of(tokenizer, params, [rng.randrange(3, vocab) for _ in range(5)])
    for _ in range(40):
        step = [rng.choice([eos, rng.randrange(3, vocab)]) for _ in range(rng.choice([1, 1, 3]))]
        foreseen = out.surely_ends(seq, step)
        reason = None
        for t in step:
            reason = out.append(seq, t, 0.0)
            if reason:
                break
        if foreseen:
            assert reason is not None, (step, seq.num_output_tokens)
        elif reason is not None:
            assert seq.stopped_by_string, (step, reason)
        if reason:
            return
    pytest.fail("no end in 40 steps")


def test_each_reason(tokenizer):
    out = OutputProcessor([2], max_model_len=9, emit=lambda e: None)
    seq = seq_of(tokenizer, SamplingParams(max_tokens=3, stop_token_ids=[7]), [5, 6, 8, 9, 10])
    assert out.surely_ends(seq, [2]) and out.surely_ends(seq, [11, 7]) and out.surely_ends(seq, [11, 12, 13])
    assert not out.surely_ends(seq, [11, 12])
    seq.params.ignore_eos = True
    assert not out.surely_ends(seq, [2])
    out.max_model_len = 7  # the context: 5 prompt tokens and 2 more fill it
    assert out.surely_ends(seq, [11, 12]) and not out.surely_ends(seq, [11])
