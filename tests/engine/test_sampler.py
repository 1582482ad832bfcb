"""Sampler masks on hand-made distributions, seeds, and per-request parameters."""
import math

import pytest
import torch

from engine import LLM, SamplingParams
from engine.sampler import draw, explain, filter_logits, outside_nucleus, sample
from tests.engine_utils import DEVICE

PROBS = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
LOGITS = PROBS.log()


def kept(params):
    return (filter_logits(LOGITS, params) > float("-inf")).nonzero().flatten().tolist()


def test_temperature_scales_logits():
    p = torch.softmax(filter_logits(LOGITS, SamplingParams(temperature=0.5)), -1)
    expected = PROBS ** 2 / (PROBS ** 2).sum()
    torch.testing.assert_close(p, expected)


@pytest.mark.parametrize("k,expected", [(1, [0]), (3, [0, 1, 2]), (0, [0, 1, 2, 3, 4, 5]), (100, [0, 1, 2, 3, 4, 5])])
def test_top_k(k, expected):
    assert kept(SamplingParams(top_k=k)) == expected


@pytest.mark.parametrize("p,expected", [(0.39, [0]), (0.41, [0, 1]), (0.64, [0, 1]), (0.66, [0, 1, 2]),
                                        (0.95, [0, 1, 2, 3, 4]), (1.0, [0, 1, 2, 3, 4, 5]), (0.01, [0])])
def test_top_p(p, expected):
    assert kept(SamplingParams(top_p=p)) == expected


@pytest.mark.parametrize("m,expected", [(0.3, [0, 1, 2]), (0.5, [0, 1]), (0.09, [0, 1, 2, 3, 4, 5]), (0.11, [0, 1, 2, 3, 4]), (1.0, [0])])
def test_min_p(m, expected):
    assert kept(SamplingParams(min_p=m)) == expected


def test_knobs_compose_in_order():
    # top-k 4 first, then top-p 0.8 of the renormalised 4 (0.44, 0.27, 0.16, 0.11): keeps 3
    assert kept(SamplingParams(top_k=4, top_p=0.8)) == [0, 1, 2]


def test_draws_follow_the_filtered_distribution():
    params = SamplingParams(top_k=3)
    g = torch.Generator().manual_seed(0)
    n = 6000
    draws = sample(LOGITS.expand(n, -1), [params] * n, [g] * n)
    counts = torch.bincount(torch.tensor(draws), minlength=6).float() / n
    expected = torch.tensor([0.40, 0.25, 0.15, 0, 0, 0]) / 0.80
    assert counts[3:].sum() == 0
    assert torch.allclose(counts, expected, atol=0.03)


@pytest.mark.parametrize("scale,top_p", [(8.0, 0.9), (3.0, 0.95), (0.3, 0.95), (0.0, 0.5), (1.0, 0.999)])
def test_the_nucleus_without_a_sort_is_the_sorted_rule(scale, top_p):
    """outside_nucleus looks at a growing top k, not the sorted vocabulary: the same tokens
    as the rule written with a sort, for peaked distributions (a few tokens), flat ones
    (past 256 and 2,048 tokens: k grows) and a uniform one (every token ties)."""
    probs = torch.softmax(torch.randn(20_000, generator=torch.Generator().manual_seed(7)) * scale, dim=-1)
    sorted_p, order = torch.sort(probs, descending=True, stable=True)
    drop = torch.zeros(20_000, dtype=torch.bool)
    drop[order] = (torch.cumsum(sorted_p, dim=-1) - sorted_p) >= top_p
    got = outside_nucleus(probs, top_p)
    if scale == 0.0:  # ties: which of the equal tokens stay is the order's choice, how many is not
        assert (~got).sum() == (~drop).sum() == 10_000
    else:
        assert torch.equal(got, drop)


def test_draw_follows_the_weights_and_never_a_zero():
    w = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.5, 0.0, 0.0, 4.5])  # unnormalised, like a residual
    g = torch.Generator().manual_seed(2)
    n = 20_000
    counts = torch.bincount(torch.tensor([draw(w, g) for _ in range(n)]), minlength=8).float() / n
    assert counts[w == 0].sum() == 0
    torch.testing.assert_close(counts, w / w.sum(), atol=0.012, rtol=0)
    assert draw(torch.tensor([0.0, 0.0, 1.0]), None) == 2
    for broken in ([float("nan"), 1.0], [0.0, 0.0], [float("inf"), 1.0]):  # as torch.multinomial refuses
        with pytest.raises(ValueError, match="cannot draw"):
            draw(torch.tensor(broken), None)


def test_greedy_and_sampled_rows_in_one_batch():
    logits = torch.stack([LOGITS, LOGITS.flip(0), LOGITS])
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0), SamplingParams(top_k=1)]
    assert sample(logits, params, [None, None, torch.Generator().manual_seed(1)]) == [0, 5, 0]


def test_explain_reports_every_stage():
    info = explain(LOGITS, SamplingParams(temperature=0.7, top_k=4, top_p=0.8), 1, top=5)
    assert set(info["stages"]) == {"logits", "temperature", "top_k", "top_p", "min_p"}
    assert info["stages"]["logits"]["kept"] == 6 and info["stages"]["top_k"]["kept"] == 4
    assert info["stages"]["top_p"]["kept"] < 4 and info["token_id"] == 1
    assert math.isclose(sum(info["stages"]["top_k"]["probs"][:4]), 1.0, rel_tol=1e-5)


def test_invalid_params_raise():
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2), dict(min_p=2),
                dict(max_tokens=0), dict(stop=[""])):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_seeded_sampling_is_reproducible_whatever_the_batch(checkpoint):
    llm = LLM(checkpoint("llama"), device=DEVICE, block_size=4)
    prompt = list(range(10, 25))
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=16, ignore_eos=True)
    alone = llm.generate(prompt, seeded)[0].token_ids
    others = [SamplingParams(temperature=t, seed=s, max_tokens=n, ignore_eos=True)
              for t, s, n in ((0.7, 1, 5), (1.3, 2, 30), (0, None, 9))]
    batch = llm.generate([prompt, [40, 41, 42], [7] * 12, [99, 98]], [seeded] + others)
    assert batch[0].token_ids == alone
    assert llm.generate(prompt, seeded)[0].token_ids == alone
    other_seed = SamplingParams(temperature=1.0, top_p=0.95, seed=99, max_tokens=16, ignore_eos=True)
    assert llm.generate(prompt, other_seed)[0].token_ids != alone
    assert len(batch[2].token_ids) == 30 and len(batch[3].token_ids) == 9


@pytest.mark.parametrize("vocab", [4096, 32000, 49152, 50257, 151936])
def test_greedy_tokens_is_argmax(vocab):
    """The chunked greedy pick equals torch.argmax, ties (first index) and NaN included."""
    from engine.sampler import greedy_tokens
    g = torch.Generator().manual_seed(vocab)
    for trial in range(40):
        logits = torch.randn(5, vocab, generator=g)
        if trial % 4 == 1:  # the maximum in several places, in different chunks
            logits[:, torch.randint(vocab, (6,), generator=g)] = 9.0
        elif trial % 4 == 2:
            logits[1, torch.randint(vocab, (2,), generator=g)] = float("nan")
        elif trial % 4 == 3:
            logits = (logits * 2).round()  # many ties
        assert torch.equal(greedy_tokens(logits), torch.argmax(logits, dim=-1))
        assert torch.equal(greedy_tokens(logits[2:3]), torch.argmax(logits[2:3], dim=-1))
