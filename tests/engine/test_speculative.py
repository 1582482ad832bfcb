"""Speculative decoding: exactness for greedy, the target's distribution for
sampling, KV rollback in both caches, and the per-round trace."""
import random

import pytest
import torch
from scipy.stats import chi2

from engine import LLM, EventList, SamplingParams, TraceEvent, Tracer
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from tests.engine_utils import DEVICE
from tests.sampling_reference import KNOBS, WORDS, chi_square, first_three, joint_distribution
from tests.tiny import load_reference, make_checkpoint

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [list(range(10, 30)), [5, 6, 7], list(range(100, 141)), [42] * 9]


@pytest.fixture(scope="module")
def models(tmp_path_factory, checkpoint):
    """target -> (target dir, unrelated random draft dir with the same tokenizer)."""
    root = tmp_path_factory.mktemp("drafts")
    return {arch: (checkpoint(arch), make_checkpoint("llama", root / f"draft-{arch}", seed=11, num_layers=1))
            for arch in ("llama", "mixtral")}


@pytest.fixture(scope="module")
def reference(models):
    out = {}
    for arch, (target, _) in models.items():
        llm = LLM(target, device=DEVICE, block_size=4)
        out[arch] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    return out


def pools_empty(llm: LLM) -> bool:
    for bm in (llm.engine.block_manager, llm.engine.speculator.bm):
        bm.check_invariants([])
        if bm.num_free_blocks != bm.num_blocks:
            return False
    return True


@pytest.mark.parametrize("k", range(1, 7))
@pytest.mark.parametrize("arch", ["llama", "mixtral"])
def test_greedy_is_identical_with_speculation(models, reference, arch, k):
    target, draft = models[arch]
    llm = LLM(target, device=DEVICE, block_size=4, draft=draft, num_speculative_tokens=k,
              max_num_batched_tokens=16)  # chunked prefill alongside verification
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == reference[arch]
    stats = llm.engine.stats
    assert stats.spec_proposed > 0 and stats.spec_accepted < stats.spec_proposed  # rejections happened
    assert pools_empty(llm)


def test_the_draft_prefills_in_passes_no_bigger_than_the_step_budget(models, reference):
    target, draft = models["mixtral"]
    llm = LLM(target, device=DEVICE, block_size=4, draft=draft, num_speculative_tokens=3,
              max_num_batched_tokens=16)
    runner = llm.engine.speculator.runner
    sizes, run = [], runner.run

    def counted(batch, rows=None):
        sizes.append(batch.query_starts[-1])
        return run(batch, rows)
    runner.run = counted
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == reference["mixtral"]
    assert max(sizes) == 16 and sum(s == 16 for s in sizes) >= 3  # the 41-token prompt took several
    assert pools_empty(llm)


def test_greedy_matches_transformers_with_speculation(models):
    target, draft = models["mixtral"]
    llm = LLM(target, device=DEVICE, draft=draft, num_speculative_tokens=3)
    prompt = PROMPTS[0]
    with torch.no_grad():
        hf = load_reference(target).generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                                             eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert llm.generate(prompt, GREEDY)[0].token_ids == hf


@pytest.mark.parametrize("k", [1, 4, 6])
def test_draft_equal_to_target_accepts_everything(models, reference, k):
    target, _ = models["llama"]
    llm = LLM(target, device=DEVICE, block_size=4, draft=target, num_speculative_tokens=k)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == reference["llama"]
    stats = llm.engine.stats
    assert stats.spec_proposed > 0 and stats.spec_accepted == stats.spec_proposed
    # each pass after the prefill yields k+1 tokens (fewer only near max_tokens)
    assert stats.target_passes < len(PROMPTS) * (1 + 24 / (k + 1) + 1)


@pytest.mark.slow  # 3,000 seeded requests
def test_sampled_output_follows_the_target_distribution(tmp_path):
    """Chi-square test of the first three sampled tokens over many seeds against the
    target's exact joint distribution, with transformers' own warpers as the reference.
    Token 1 comes from the prefill; tokens 2-3 from a round of k = 3 proposals."""
    target = make_checkpoint("llama", tmp_path / "t", seed=1, num_layers=2, words=WORDS)
    draft = make_checkpoint("llama", tmp_path / "d", seed=2, num_layers=1, words=WORDS)
    prompt = [1, 2, 3]
    n = 3000
    llm = LLM(target, device=DEVICE, draft=draft, num_speculative_tokens=3, max_num_seqs=128)
    outs = llm.generate([prompt] * n, [SamplingParams(seed=i, max_tokens=5, ignore_eos=True, **KNOBS)
                                       for i in range(n)])
    stats = llm.engine.stats
    assert stats.spec_proposed >= 3 * n and stats.spec_accepted < stats.spec_proposed
    observed = first_three(outs)
    expected = joint_distribution(target, prompt)
    stat, dof = chi_square(observed, expected)
    assert stat < chi2.ppf(0.999, dof), (stat, dof)
    # The same test has the power to tell the draft's distribution apart.
    draft_stat, _ = chi_square(observed, joint_distribution(draft, prompt).clamp(min=1e-9) * (expected > 0))
    assert draft_stat > chi2.ppf(0.999, dof)


@pytest.mark.parametrize("num_kv_blocks", [40, 14])  # 14: the request is preempted on the way
def test_seeded_request_draws_the_same_tokens_in_any_batch(models, num_kv_blocks):
    """A seeded request makes the same random draws alone and in a crowd: behind a
    prefix-cache hit, under a tiny token budget, and across a preemption."""
    target, draft = models["mixtral"]
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=3, max_tokens=20, ignore_eos=True)
    alone = LLM(target, device=DEVICE, block_size=4, draft=draft, num_speculative_tokens=4)
    want = alone.generate(PROMPTS[0], params)[0]
    crowded = LLM(target, device=DEVICE, block_size=4, draft=draft, num_speculative_tokens=4,
                  max_num_batched_tokens=8, num_kv_blocks=num_kv_blocks)
    # the crowd's seeds decide its lengths, so when the pool runs out: these give both a
    # preemption and a prefix hit at 14 blocks (with some, the preempted request returns
    # after the shared blocks were evicted)
    others = [SamplingParams(temperature=0.7, seed=5 + i, max_tokens=20, ignore_eos=True) for i in range(5)]
    outs = crowded.generate(PROMPTS + [[9, 8, 7], PROMPTS[0]], others + [params])
    assert outs[-1].token_ids == want.token_ids
    assert outs[-1].usage.cached_tokens > 0  # it shared the first request's prompt blocks
    assert (outs[-1].metrics["preemptions"] > 0) == (num_kv_blocks == 14)
    assert pools_empty(crowded)


def test_seeded_requests_match_alone_under_random_crowds(models):
    """Random workloads: budgets down to one round, small pools (preemption), shared
    prompts (prefix hits), mixed knobs. Every seeded request gives its alone tokens."""
    target, draft = models["mixtral"]
    rng = random.Random(2)
    alone, preempted = {}, 0
    for _ in range(6):
        k = rng.randint(1, 5)
        if k not in alone:
            alone[k] = LLM(target, device=DEVICE, block_size=4, draft=draft, num_speculative_tokens=k)
        prompts = [[rng.randrange(4, 300) for _ in range(rng.randint(1, 30))] for _ in range(rng.randint(2, 7))]
        prompts[-1] = list(prompts[0])
        params = [SamplingParams(temperature=rng.choice([0.7, 1.3]), top_p=rng.choice([1.0, 0.9]),
                                 top_k=rng.choice([0, 20]), min_p=rng.choice([0.0, 0.05]), seed=rng.randrange(10**6),
                                 max_tokens=rng.randint(1, 24), ignore_eos=True) for _ in prompts]
        crowd = LLM(target, device=DEVICE, block_size=4, draft=draft, num_speculative_tokens=k,
                    max_num_batched_tokens=rng.choice([k + 1, 8, 16]), num_kv_blocks=rng.choice([20, 30]),
                    max_num_seqs=rng.randint(2, 6))
        outs = crowd.generate(prompts, params)
        for p, sp, o in zip(prompts, params, outs):
            assert o.token_ids == alone[k].generate(p, sp)[0].token_ids
        preempted += sum(o.metrics["preemptions"] for o in outs)
        assert pools_empty(crowd)
    assert preempted > 0


def test_prefix_cache_with_speculation(models, reference):
    """Shared prefixes hit in both pools; greedy output is unchanged."""
    target, draft = models["mixtral"]
    llm = LLM(target, device=DEVICE, block_size=4, draft=draft, num_speculative_tokens=3)
    first = llm.generate(PROMPTS, GREEDY)
    again = llm.generate(PROMPTS, GREEDY)  # every full prompt block is cached now
    assert [o.token_ids for o in first] == [o.token_ids for o in again] == reference["mixtral"]
    assert sum(o.usage.cached_tokens for o in again) >= sum((len(p) - 1) // 4 * 4 for p in PROMPTS)
    assert llm.engine.speculator.bm.num_cached_blocks > 0
    shared = [PROMPTS[2] + [7, 8, 9], PROMPTS[2] + [11]]  # a cached prefix with new tails
    cold = LLM(target, device=DEVICE, block_size=4, enable_prefix_caching=False)
    assert [o.token_ids for o in llm.generate(shared, GREEDY)] == [o.token_ids for o in cold.generate(shared, GREEDY)]
    assert pools_empty(llm)


def test_no_block_leaks_with_rejections_preemptions_and_aborts(models):
    target, draft = models["mixtral"]
    engine = LLMEngine(target, device=DEVICE, draft=draft, num_speculative_tokens=3,
                       config=EngineConfig(block_size=4, num_kv_blocks=30, max_num_seqs=5, max_num_batched_tokens=20))
    rng = random.Random(5)
    live = []
    for i in range(200):
        if rng.random() < 0.5:
            prompt = [rng.randrange(4, 300) for _ in range(rng.randint(1, 25))]
            params = SamplingParams(temperature=rng.choice([0, 1.0]), max_tokens=rng.randint(1, 16),
                                    seed=i, ignore_eos=True)
            live.append(engine.add_request(prompt, params, speculative=rng.random() < 0.8))
        if live and rng.random() < 0.1:
            engine.abort(live.pop(rng.randrange(len(live))))
        for out in engine.step():
            if out.finished and out.request_id in live:
                live.remove(out.request_id)
        engine.block_manager.check_invariants(engine.scheduler.running)
        engine.speculator.bm.check_invariants(list(engine.speculator.views.values()))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats.spec_accepted < engine.stats.spec_proposed
    assert sum(s.num_preemptions for s in engine.requests.values()) > 0
    for bm in (engine.block_manager, engine.speculator.bm):
        bm.check_invariants([])
        assert bm.num_free_blocks == bm.num_blocks
    assert not engine.speculator.views


def test_speculation_can_be_turned_off_per_request(models):
    target, draft = models["llama"]
    engine = LLMEngine(target, device=DEVICE, draft=draft, config=EngineConfig(block_size=4))
    engine.add_request(PROMPTS[0], GREEDY, speculative=False)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats.spec_proposed == 0 and engine.stats.target_passes == 24


def test_llm_api_switches_speculation_per_request(models, reference):
    target, draft = models["llama"]
    llm = LLM(target, device=DEVICE, block_size=4, draft=draft)
    outs = llm.generate(PROMPTS, GREEDY, speculative=False)
    assert [o.token_ids for o in outs] == reference["llama"] and llm.engine.stats.spec_proposed == 0
    llm.chat([{"role": "user", "content": "hi"}], GREEDY, num_speculative_tokens=2)
    assert 0 < llm.engine.stats.spec_proposed
    items = list(llm.stream(PROMPTS[0], GREEDY, trace="basic", num_speculative_tokens=1))
    assert {i.data["k"] for i in items if isinstance(i, TraceEvent) and i.type == "spec"} == {1}


def test_k_can_be_set_per_request(models):
    target, _ = models["llama"]
    sink = EventList()
    engine = LLMEngine(target, device=DEVICE, draft=target, num_speculative_tokens=5, tracer=Tracer(sink),
                       config=EngineConfig(block_size=4))
    two = engine.add_request(PROMPTS[0], GREEDY, num_speculative_tokens=2)
    five = engine.add_request(PROMPTS[1], GREEDY)
    capped = engine.add_request(PROMPTS[3], GREEDY, num_speculative_tokens=9)
    while engine.has_unfinished_requests():
        engine.step()
    ks = {rid: {e.data["k"] for e in sink.of(rid, "spec")} for rid in (two, five, capped)}
    assert max(ks[two]) == 2 and max(ks[five]) == 5 and max(ks[capped]) == 5


def test_draft_with_another_vocabulary_fails_at_load(models, tmp_path):
    target, _ = models["llama"]
    other = make_checkpoint("llama", tmp_path / "words", words=["<eos>", "x", "y"])
    with pytest.raises(ValueError, match="does not share the target's vocabulary"):
        LLM(target, draft=other)


def test_spec_events(models):
    target, draft = models["mixtral"]
    llm = LLM(target, device=DEVICE, draft=draft, num_speculative_tokens=4)
    items = list(llm.stream(PROMPTS[2], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), trace="basic"))
    spec = [i.data for i in items if isinstance(i, TraceEvent) and i.type == "spec"]
    assert spec
    final = items[-1]
    proposed = accepted = 0
    for ev in spec:
        assert len(ev["proposed"]) == ev["k"] == len(ev["draft_probs"]) == len(ev["target_probs"]) <= 4
        assert 0 <= ev["accepted"] <= ev["k"]
        assert (ev["rejected_position"] is None) == (ev["accepted"] == ev["k"])
        assert ev["token_kind"] == ("bonus" if ev["accepted"] == ev["k"] else "corrected")
        # greedy: the probabilities are the models' plain softmax, for the page to show
        assert all(0 < p < 1 for p in ev["target_probs"] + ev["draft_probs"])
        proposed += ev["k"]
        accepted += ev["accepted"]
        assert abs(ev["acceptance_rate"] - accepted / proposed) < 1e-9
    # every generated token has its `sample` event, saying where it came from
    samples = [i.data for i in items if isinstance(i, TraceEvent) and i.type == "sample"]
    assert [s["token_id"] for s in samples] == final.token_ids
    assert [s["position"] for s in samples] == list(range(len(PROMPTS[2]), len(PROMPTS[2]) + 20))
    sources = [s["source"] for s in samples]
    assert sources.count("draft") == accepted
    assert sources.count("corrected") + sources.count("bonus") == len(spec)
    assert sources.count("bonus") == sum(ev["accepted"] == ev["k"] for ev in spec)
    assert sources[0] == "target"  # the first token comes from the prefill
    # a kept proposal's target probability is the one its sample event shows at that position
    kept_p = [p for ev in spec for p in ev["target_probs"][: ev["accepted"]]]
    assert kept_p == pytest.approx([s["token_prob"] for s in samples if s["source"] == "draft"], abs=1e-3)
