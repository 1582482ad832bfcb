"""n choices from one prompt: the prompt prefilled once (the other choices take its full
pages from the prefix cache), each choice its own draw (seed + i), reproducible."""
import pytest
import torch

from engine import LLM, SamplingParams
from tests.engine_utils import DEVICE

PROMPT = torch.randint(4, 300, (14,), generator=torch.Generator().manual_seed(5)).tolist()


@pytest.fixture(scope="module")
def llm(checkpoint):
    return LLM(checkpoint("llama"), device=DEVICE, dtype="float32", block_size=4)


def run(engine, params, prompt=PROMPT, abort_first=False):
    rid = engine.add_request(prompt, params)
    ids = engine.choice_ids(rid, params.n)
    if abort_first:
        engine.abort(rid)
    tokens = {i: [] for i in ids}
    finish = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.request_id in tokens:
                if o.token_id >= 0:
                    tokens[o.request_id].append(o.token_id)
                if o.finished:
                    finish[o.request_id] = o.finish_reason
    usage = {i: engine.get_output(i).usage for i in ids}
    return ids, tokens, finish, usage


def test_the_prompt_is_prefilled_once(llm):
    ids, tokens, finish, usage = run(llm.engine, SamplingParams(n=4, temperature=1.0, seed=9, max_tokens=5,
                                                                ignore_eos=True))
    assert ids[0] and ids[1:] == [f"{ids[0]}.{i}" for i in (1, 2, 3)]
    assert set(finish) == set(ids) and all(len(t) == 5 for t in tokens.values())
    assert usage[ids[0]].cached_tokens == 0
    full = (len(PROMPT) // 4) * 4  # the full 4-token pages of the prompt
    for cid in ids[1:]:  # the others computed only the partial last page
        assert usage[cid].cached_tokens == full and usage[cid].prompt_tokens == len(PROMPT)
    assert len({tuple(t) for t in tokens.values()}) > 1  # their own draws


def test_each_choice_is_the_request_seeded_seed_plus_i(llm):
    params = SamplingParams(n=3, temperature=1.2, seed=40, max_tokens=6, ignore_eos=True)
    ids, tokens, _, _ = run(llm.engine, params)
    again = run(llm.engine, params)[1]
    assert list(tokens.values()) == list(again.values())  # the set is reproducible
    for i, cid in enumerate(ids):
        alone = llm.generate([PROMPT], SamplingParams(temperature=1.2, seed=40 + i, max_tokens=6, ignore_eos=True))
        assert alone[0].token_ids == tokens[cid]


def test_an_abort_before_the_prefill_ends_every_choice(llm):
    ids, tokens, finish, _ = run(llm.engine, SamplingParams(n=3, max_tokens=4), abort_first=True)
    assert finish == {i: "abort" for i in ids} and not any(tokens.values())
    llm.engine.block_manager.check_invariants([])
