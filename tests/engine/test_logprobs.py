"""Log-probabilities (OpenAI's logprobs, top_logprobs, echo) against transformers' logits on
the same tokens: the log-softmax of the raw logits, within 1e-3, whatever the sampling knobs."""
import pytest
import torch

from engine import LLM, SamplingParams
from tests.engine_utils import DEVICE
from tests.tiny import load_reference

PROMPT = torch.randint(4, 300, (19,), generator=torch.Generator().manual_seed(3)).tolist()


@pytest.fixture(scope="module")
def pair(checkpoint):
    path = checkpoint("llama")
    # a 6-token budget: the prompt's logits come from four chunks
    return LLM(path, device=DEVICE, dtype="float32", block_size=4, max_num_batched_tokens=6), load_reference(path)


def run(engine, params, prompt=PROMPT):
    rid = engine.add_request(prompt, params)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == rid]
    return outs


def reference_logprobs(ref, ids):
    with torch.no_grad():
        return torch.log_softmax(ref(torch.tensor([ids])).logits[0].float(), dim=-1)  # [T, V]


@pytest.mark.parametrize("params", [SamplingParams(temperature=0, max_tokens=5, logprobs=3),
                                    SamplingParams(temperature=1.3, top_k=5, seed=2, max_tokens=5, logprobs=20,
                                                   ignore_eos=True)],
                         ids=["greedy", "sampled"])
def test_each_tokens_logprobs_are_the_raw_logits_log_softmax(pair, params):
    llm, ref = pair
    outs = run(llm.engine, params)
    tokens = [o.token_id for o in outs]
    lsm = reference_logprobs(ref, PROMPT + tokens)
    for i, o in enumerate(outs):
        row = lsm[len(PROMPT) - 1 + i]
        assert o.logprobs.token_id == o.token_id
        assert abs(o.logprobs.logprob - float(row[o.token_id])) < 1e-3
        assert o.logprobs.rank == int((row > row[o.token_id]).sum()) + 1
        top = torch.topk(row, params.logprobs)
        assert [t for t, _ in o.logprobs.top] == top.indices.tolist()
        assert max(abs(a - b) for (_, a), b in zip(o.logprobs.top, top.values.tolist())) < 1e-3
    if params.greedy:
        assert all(o.logprobs.rank == 1 for o in outs)


def test_prompt_logprobs_over_chunked_prefill_and_a_cached_prefix(pair):
    llm, ref = pair
    run(llm.engine, SamplingParams(temperature=0, max_tokens=1))  # the prompt's blocks now in the prefix cache
    outs = run(llm.engine, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2))
    lsm = reference_logprobs(ref, PROMPT)
    first = outs[0].prompt_logprobs
    assert len(first) == len(PROMPT) and first[0] is None
    for i in range(1, len(PROMPT)):
        assert first[i].token_id == PROMPT[i]
        assert abs(first[i].logprob - float(lsm[i - 1, PROMPT[i]])) < 1e-3
        assert [t for t, _ in first[i].top] == torch.topk(lsm[i - 1], 2).indices.tolist()
    assert outs[1].prompt_logprobs is None  # only the first output carries them
    assert outs[0].logprobs is None  # not asked for


def test_sampling_knobs_do_not_change_the_reported_logprobs(pair):
    llm, _ = pair
    plain = run(llm.engine, SamplingParams(temperature=0, max_tokens=3, logprobs=0))
    hot = run(llm.engine, SamplingParams(temperature=0.01, top_p=0.5, seed=1, max_tokens=3, logprobs=0))
    assert [o.token_id for o in plain] == [o.token_id for o in hot]
    assert [round(o.logprobs.logprob, 4) for o in plain] == [round(o.logprobs.logprob, 4) for o in hot]
    assert all(o.logprobs.top == [] for o in plain)


def test_logprobs_with_speculative_rounds(checkpoint):
    path = checkpoint("llama")
    llm, ref = LLM(path, device=DEVICE, dtype="float32", block_size=4, draft="ngram"), load_reference(path)
    prompt = PROMPT[:6] * 3  # repeats: the n-gram proposer finds matches
    outs = run(llm.engine, SamplingParams(temperature=0, max_tokens=8, logprobs=1, ignore_eos=True), prompt)
    lsm = reference_logprobs(ref, prompt + [o.token_id for o in outs])
    for i, o in enumerate(outs):
        assert abs(o.logprobs.logprob - float(lsm[len(prompt) - 1 + i, o.token_id])) < 1e-3
