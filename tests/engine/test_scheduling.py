"""Paged KV cache, prefix caching, continuous batching, preemption and aborts."""
import random

import pytest
import torch

from engine import LLM, EventList, SamplingParams, Tracer
from engine.llm_engine import LLMEngine
from engine.config import EngineConfig
from tests.engine_utils import DEVICE

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def prompts(n, lo=3, hi=40, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(4, 300) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


@pytest.fixture(scope="module")
def path(checkpoint):
    return checkpoint("mixtral")


@pytest.fixture(scope="module")
def alone(path):
    """Reference outputs: each prompt run on its own, no chunking, no cache sharing."""
    llm = LLM(path, device=DEVICE, block_size=4, max_num_seqs=1, enable_prefix_caching=False)
    return {tuple(p): llm.generate(p, GREEDY)[0].token_ids for p in prompts(12)}


def free_all(engine: LLMEngine) -> bool:
    bm = engine.block_manager
    bm.check_invariants([])
    return bm.num_free_blocks == bm.num_blocks


def test_prefix_cache_reuses_full_blocks(path):
    tracer = Tracer(events := EventList())
    engine = LLMEngine(path, device=DEVICE, config=EngineConfig(block_size=4), tracer=tracer)
    system = list(range(10, 40))  # 30 shared tokens = 7 full blocks
    first = engine.add_request(system + [50, 51, 52], GREEDY)
    while engine.has_unfinished_requests():
        engine.step()
    second = engine.add_request(system + [60, 61], GREEDY)
    while engine.has_unfinished_requests():
        engine.step()
    out1, out2 = engine.get_output(first), engine.get_output(second)
    assert out1.usage.cached_tokens == 0
    assert out2.usage.cached_tokens == 28  # 7 blocks x 4 tokens
    lookup = events.of(second, "prefix_cache.lookup")[0].data
    assert lookup["hit"] and len(lookup["cached_blocks"]) == 7
    prefill = [e.data for e in events.of(None, "schedule.step")
               if any(b["request_id"] == second for b in e.data["batch"])][0]
    assert [b["num_tokens"] for b in prefill["batch"] if b["request_id"] == second] == [4]  # 32 - 28 computed

    cold = LLMEngine(path, device=DEVICE, config=EngineConfig(block_size=4, enable_prefix_caching=False))
    rid = cold.add_request(system + [60, 61], GREEDY)
    while cold.has_unfinished_requests():
        cold.step()
    assert cold.get_output(rid).token_ids == out2.token_ids
    assert free_all(engine) and free_all(cold)


def test_hash_collision_is_verified(path, monkeypatch):
    llm = LLM(path, device=DEVICE, block_size=4)
    bm = llm.engine.block_manager
    llm.generate(list(range(10, 30)), GREEDY)
    # Forge: point every cached hash at a block whose ids differ.
    for h, bid in list(bm.cached.items()):
        bm.blocks[bid].token_ids = tuple(t + 1 for t in bm.blocks[bid].token_ids)
    out = llm.generate(list(range(10, 30)), GREEDY)[0]
    assert out.usage.cached_tokens == 0


def test_hash_collision_with_another_parent_is_verified(path, monkeypatch):
    # A weak hash that forgets the parent: block [B] after [A] collides with [B] first.
    monkeypatch.setattr("engine.block_manager.chain_hash", lambda parent, ids: hash(ids))
    llm = LLM(path, device=DEVICE, block_size=4)
    a, b, tail = [10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32]
    llm.generate(a + b + tail, GREEDY)
    assert llm.generate(a + b + tail, GREEDY)[0].usage.cached_tokens == 8  # a real hit still hits
    out = llm.generate(b + b + tail, GREEDY)[0]
    assert out.usage.cached_tokens == 0  # same ids as the cached [B], but its K/V saw [A] first
    cold = LLM(path, device=DEVICE, block_size=4, enable_prefix_caching=False)
    assert out.token_ids == cold.generate(b + b + tail, GREEDY)[0].token_ids


def test_lru_eviction_keeps_recent_prefixes(path):
    llm = LLM(path, device=DEVICE, block_size=4, num_kv_blocks=24)
    bm = llm.engine.block_manager
    a, b = list(range(10, 30)), list(range(100, 120))  # 4 full prompt blocks each
    llm.generate(a, GREEDY)  # a is allocated (and cached) first, with the lowest block ids
    llm.generate(b, GREEDY)
    assert llm.generate(a, GREEDY)[0].usage.cached_tokens == 16  # a is now the most recently used
    # Take every free block except the 4 most recently used.
    n = bm.num_free_blocks - 4
    llm.generate(list(range(200, 200 + 4 * n)), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    assert llm.generate(a, GREEDY)[0].usage.cached_tokens == 16  # recently used survived
    assert llm.generate(b, GREEDY)[0].usage.cached_tokens == 0  # least recently used went first


@pytest.mark.parametrize("budget", [8, 64])
def test_concurrent_greedy_equals_alone(path, alone, budget):
    llm = LLM(path, device=DEVICE, block_size=4, max_num_batched_tokens=budget, max_num_seqs=5)
    ps = prompts(12)
    outs = llm.generate(ps, GREEDY)
    for p, o in zip(ps, outs):
        assert o.token_ids == alone[tuple(p)]
    assert free_all(llm.engine)


def test_chunked_prefill_mixes_with_decode(path):
    tracer = Tracer(events := EventList())
    engine = LLMEngine(path, device=DEVICE, config=EngineConfig(block_size=4, max_num_batched_tokens=8),
                       tracer=tracer)
    engine.add_request(list(range(10, 14)), GREEDY)
    engine.step()  # short prompt prefilled, now decoding
    engine.add_request(list(range(20, 60)), GREEDY)  # 40 tokens: 5+ chunks under a budget of 8
    while engine.has_unfinished_requests():
        engine.step()
    steps = [e.data for e in events.of(None, "schedule.step")]
    mixed = [s for s in steps if {b["kind"] for b in s["batch"]} == {"prefill", "decode"}]
    assert mixed and all(s["num_tokens"] <= 8 for s in steps)
    assert any(b["kind"] == "prefill" and b["start"] > 0 for s in steps for b in s["batch"])


def test_preemption_under_a_small_pool_still_matches(path, alone):
    # 14 blocks x 4 tokens: far less than 12 requests need together.
    llm = LLM(path, device=DEVICE, block_size=4, num_kv_blocks=14, max_num_seqs=8, max_num_batched_tokens=16)
    ps = prompts(12)
    outs = llm.generate(ps, GREEDY)
    for p, o in zip(ps, outs):
        assert o.token_ids == alone[tuple(p)]
    assert sum(o.metrics["preemptions"] for o in outs) > 0
    assert free_all(llm.engine)


def test_max_running_requests_cap(path):
    engine = LLMEngine(path, device=DEVICE, config=EngineConfig(block_size=4, max_num_seqs=3))
    for p in prompts(7):
        engine.add_request(p, GREEDY)
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, len(engine.scheduler.running))
    assert peak == 3


def test_random_workload_with_aborts_leaks_nothing(path):
    engine = LLMEngine(path, device=DEVICE,
                       config=EngineConfig(block_size=4, num_kv_blocks=40, max_num_seqs=6, max_num_batched_tokens=24))
    rng = random.Random(3)
    shared = [rng.randrange(4, 300) for _ in range(12)]
    live, preempted, finished = [], 0, 0
    for i in range(300):
        if rng.random() < 0.6:
            body = [rng.randrange(4, 300) for _ in range(rng.randint(1, 30))]
            prompt = (shared if rng.random() < 0.5 else []) + body
            params = SamplingParams(temperature=rng.choice([0, 0.9]), top_k=rng.choice([0, 5]),
                                    max_tokens=rng.randint(1, 20), seed=i, ignore_eos=True)
            live.append(engine.add_request(prompt, params))
        if live and rng.random() < 0.15:
            engine.abort(live.pop(rng.randrange(len(live))))
        for out in engine.step():
            if out.finished and out.request_id in live:
                live.remove(out.request_id)
                finished += 1
        running = engine.scheduler.running
        engine.block_manager.check_invariants(running)
        preempted = max(preempted, sum(s.num_preemptions for s in engine.requests.values()))
    while engine.has_unfinished_requests():
        engine.step()
    assert finished > 100 and preempted > 0
    assert free_all(engine)


def test_abort_frees_blocks_at_once(path):
    engine = LLMEngine(path, device=DEVICE, config=EngineConfig(block_size=4))
    rid = engine.add_request(list(range(10, 40)), SamplingParams(temperature=0, max_tokens=50))
    engine.step()
    assert engine.block_manager.num_free_blocks < engine.block_manager.num_blocks
    assert engine.abort(rid) and not engine.abort(rid)
    assert engine.get_output(rid).finish_reason == "abort"
    assert free_all(engine)
    (out,) = engine.step()  # the abort is reported like any finish
    assert out.request_id == rid and out.finished and out.finish_reason == "abort"
    assert not engine.has_unfinished_requests() and engine.step() == []


def test_sequence_bigger_than_pool_finishes_cleanly(path):
    engine = LLMEngine(path, device=DEVICE, config=EngineConfig(block_size=4, num_kv_blocks=4))
    rid = engine.add_request(list(range(10, 20)), SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    for _ in range(200):
        if not engine.has_unfinished_requests():
            break
        engine.step()
    out = engine.get_output(rid)
    # 16 slots hold the K/V of 16 tokens; the 17th is drawn from the last of them.
    assert out.finish_reason == "length" and len(out.prompt_token_ids) + len(out.token_ids) == 17
    assert free_all(engine)
    with pytest.raises(ValueError, match="KV cache holds only 16"):
        engine.add_request(list(range(10, 30)), GREEDY)


def test_pool_size_from_a_memory_fraction(path, monkeypatch):
    monkeypatch.setattr("engine.model_runner._available_host_memory", lambda: 64 << 20)
    llm = LLM(path, device=DEVICE, block_size=4, kv_cache_memory_fraction=0.25)
    cfg = llm.engine.model_config
    per_block = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4 * 4  # K and V, float32, 4 tokens
    assert llm.engine.block_manager.num_blocks == (16 << 20) // per_block
    assert llm.engine.runner.kv_cache.numel() * 4 == llm.engine.block_manager.num_blocks * per_block
    assert llm.generate([5, 6, 7], GREEDY)[0].token_ids
