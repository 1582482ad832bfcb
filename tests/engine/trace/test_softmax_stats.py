"""What the trace reads of a softmax (engine/trace/softmax_stats.py): the C kernel (cpu_stats.c)
against PyTorch's softmax, topk, logsumexp and counts, on rows like the sampler's and the
logit lens's (masked tokens, strided rows, probabilities that underflow), and the `sample`
event's figures from either path alike."""
from __future__ import annotations

import pytest
import torch

from engine.sampler import explain
from engine.sampling_params import SamplingParams
from engine.trace.softmax_stats import by_kernel, first_candidates, reference, softmax_stats


@pytest.fixture
def c_path(cpu_kernels_switch):
    cpu_kernels_switch(True)


def assert_same(a, b):
    for ids, ref_ids, probs in zip(a.top_ids, b.top_ids, b.top_probs):  # masked candidates (p = 0) tie in any order
        assert [i for i, p in zip(ids, probs) if p > 0] == [i for i, p in zip(ref_ids, probs) if p > 0]
    for name in ("top_probs", "lse", "entropy", "chosen_probs"):
        x, y = getattr(a, name), getattr(b, name)
        if x is not None or y is not None:
            torch.testing.assert_close(torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64),
                                       rtol=2e-5, atol=1e-7)
    assert a.kept == b.kept and a.rank == b.rank


@pytest.mark.parametrize("V", [1, 7, 16, 63, 64, 100, 4096, 20011])
def test_c_kernel_matches_torch(c_path, V):
    g = torch.Generator().manual_seed(V)
    z = torch.randn(6, V, generator=g) * 4
    z[1, 1::3] = float("-inf")  # masked tokens, as top-k / top-p / min-p leave them
    z[2, 1:] = float("-inf")  # one token left
    chosen = torch.randint(0, V, (6,), generator=g).tolist()
    chosen[2] = 0
    k = min(5, V)
    assert_same(softmax_stats(z, 5, chosen), reference(z, k, chosen))
    assert_same(softmax_stats(z, 5), reference(z, k))


def test_every_token_a_candidate(c_path):
    z = torch.randn(2, 300, generator=torch.Generator().manual_seed(2))
    assert_same(softmax_stats(z, 300, [5, 6]), reference(z, 300, [5, 6]))


def test_strided_rows_as_the_logit_lens_reads_them(c_path):
    both = torch.randn(31, 3, 1000, generator=torch.Generator().manual_seed(1)) * 6  # [L + 1, tokens, V]
    rows = both[:, 1]  # one token's lens: row stride 3 * V
    assert rows.stride(0) == 3000
    assert_same(softmax_stats(rows, 4, [7] * 31), reference(rows.contiguous(), 4, [7] * 31))


def test_probabilities_that_underflow_are_not_kept(c_path):
    # float32 softmax: e^-90 ~ 8e-40 is a denormal, e^-104 rounds to 0, e^-120 is 0
    z = torch.tensor([[0.0, -50.0, -90.0, -103.0, -104.5, -120.0, float("-inf")]])
    s = softmax_stats(z, 3)
    assert s.kept == reference(z, 3).kept == [4]
    assert s.top_ids == [[0, 1, 2]]


def test_ties_keep_the_lower_token_first(c_path):
    z = torch.zeros(1, 50)
    z[0, [9, 30, 41]] = 2.0
    s = softmax_stats(z, 5, [30])
    assert s.top_ids == [[9, 30, 41, 0, 1]]
    assert s.rank == [1]  # no logit above its own
    assert s.top_probs[0][0] == pytest.approx(torch.softmax(z, -1)[0, 9].item(), rel=1e-6)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0), SamplingParams(temperature=0.7),
                                    SamplingParams(temperature=0.8, top_k=12, top_p=0.9, min_p=0.02)])
def test_the_sample_events_figures_match_a_softmax(cpu_kernels_switch, params):
    logits = torch.randn(3000, generator=torch.Generator().manual_seed(3)) * 3
    token = 17
    cpu_kernels_switch(True)
    c = explain(logits, params, token, top=8)
    cpu_kernels_switch(False)
    t = explain(logits, params, token, top=8)
    assert c["candidates"] == t["candidates"] and token in c["candidates"]
    for name, stage in c["stages"].items():
        assert stage["kept"] == t["stages"][name]["kept"]
        torch.testing.assert_close(torch.tensor(stage["probs"]), torch.tensor(t["stages"][name]["probs"]),
                                   rtol=2e-5, atol=1e-8)
    # and against the softmax itself: the last stage's distribution
    from engine.sampler import filter_logits
    p = torch.softmax(filter_logits(logits, params) if not params.greedy else logits, dim=-1)
    assert c["token_prob"] == pytest.approx(p[token].item(), rel=1e-5, abs=1e-9)
    assert c["entropy"] == pytest.approx(-(p * p.log()).nansum().item(), rel=1e-4)
    assert c["stages"]["logits"]["kept"] == 3000


def test_the_first_candidates_of_a_longer_list_are_the_shorter_list(c_path):
    """first_candidates: the C kernel's top k of a row (ties: the lower id first) is the head
    of its top k' for any k' > k, so a token's sample event and its lens share one pass."""
    g = torch.Generator().manual_seed(3)
    z = (torch.randn(4, 4096, generator=g) * 2).round()  # rounded: many ties among the top
    z[1, ::2] = float("-inf")
    z[3, 5:] = float("-inf")  # fewer live tokens than candidates
    chosen = [0, 1, 2, 3]
    assert by_kernel(z)
    for k in (1, 5, 8):
        short, long = softmax_stats(z, k, chosen), first_candidates(softmax_stats(z, 12, chosen), k)
        assert short == long


def test_explain_reads_the_callers_stats_as_its_own(c_path):
    """explain with raw_stats (softmax_stats of its row, more candidates, a chosen token)
    says what it says without them, greedy or sampled, the token among the top or not."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4096, generator=g) * 3
    low = int(logits.argmin())
    for params in (SamplingParams(temperature=0), SamplingParams(temperature=0.7, top_k=20, top_p=0.9)):
        for token in (int(logits.argmax()), low):
            stats = softmax_stats(logits[None], 12, [token])
            assert explain(logits, params, token, 8, None, stats) == explain(logits, params, token, 8)
