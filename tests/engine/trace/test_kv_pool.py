"""kv.pool: the engine's events rebuild its whole block pool after every step (other
requests' blocks, prefix sharing, preemption and speculation included), say only what
changed, and any one traced request's events, from its arrival on, are enough."""
from __future__ import annotations

import pytest

from engine import LLM, EventList, SamplingParams, TraceEvent, Tracer
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from tests.engine_utils import DEVICE
from visualizers.kv_cache import apply_kv_pool, pool_at


def truth(engine: LLMEngine) -> dict:
    """The pool read from the engine's own structures, as the app once snapshotted it."""
    bm, bs = engine.block_manager, engine.config.block_size
    owners, fill = {}, {}
    for rid, seq in engine.requests.items():
        if seq.is_finished:
            continue
        for i, b in enumerate(seq.block_table):
            owners.setdefault(b, []).append(rid)
            fill[b] = max(fill.get(b, 0), max(0, min(bs, seq.num_computed_tokens - i * bs)))
    return {"ref": [b.ref_count for b in bm.blocks],
            "cached": [b.hash is not None and bm.cached.get(b.hash) == b.block_id for b in bm.blocks],
            "owners": {b: sorted(o) for b, o in owners.items()}, "fill": fill}


def traced_live(engine: LLMEngine) -> bool:
    return any(s.traced and not s.is_finished for s in engine.requests.values())


def same(pool: dict, want: dict) -> bool:
    return (pool["ref"] == want["ref"] and pool["cached"] == want["cached"] and pool["fill"] == want["fill"]
            and {b: sorted(o) for b, o in pool["owners"].items()} == want["owners"])


@pytest.mark.parametrize("mode", ["traced", "always"])
def test_the_events_rebuild_the_pool_after_every_step(checkpoint, mode):
    sink = EventList()
    engine = LLMEngine(checkpoint("mixtral"), device=DEVICE, tracer=Tracer(sink), trace_level="off",
                       draft="ngram", num_speculative_tokens=3, kv_pool_events=mode,
                       config=EngineConfig(block_size=4, num_kv_blocks=18, max_num_seqs=4))
    shared = list(range(30, 46))  # four full blocks: the later requests hit them in the prefix cache
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ids = [engine.add_request(shared + [7, 8, 9] * 3, params, trace_level="basic"),
           engine.add_request(shared + [5, 6], params),  # untraced: its blocks are drawn all the same
           engine.add_request(shared + list(range(60, 80)), params, trace_level="full")]
    pool, seen, steps = None, 0, 0
    while engine.has_unfinished_requests():
        watched = traced_live(engine)
        engine.step()
        steps += 1
        for e in sink.events[seen:]:
            if e.type == "kv.pool":
                assert e.request_id is None and e.step == engine.step_count
                assert e.data["blocks"] == sorted(e.data["blocks"])
                pool = apply_kv_pool(pool, e.to_dict())
        seen = len(sink.events)
        if mode == "always" or watched or traced_live(engine):  # "traced": told while a traced request lives
            assert pool is not None and same(pool, truth(engine)), engine.step_count
    assert sum(engine.requests[r].num_preemptions for r in ids) >= 1  # the pool ran dry on the way
    assert sum(engine.requests[r].spec_proposed for r in ids) >= 1  # proposals rolled back too
    pools = [e for e in sink.events if e.type == "kv.pool"]
    assert pools[0].data["full"] and not any(e.data["full"] for e in pools[1:])
    assert len(pools) <= steps and all(e.data["blocks"] for e in pools)  # only steps that changed it
    assert any(ids[1] in o for e in pools for o in e.data["owners"])  # the untraced request's blocks
    assert any(len(o) > 1 for e in pools for o in e.data["owners"])  # a block shared through the prefix cache
    assert all(set(e.data["request_ids"]) <= {ids[0], ids[2]} for e in pools)


def test_tracing_off_sends_no_pool_and_an_idle_engine_none_either(checkpoint):
    sink = EventList()
    engine = LLMEngine(checkpoint("mixtral"), device=DEVICE, tracer=Tracer(sink), trace_level="off",
                       config=EngineConfig(block_size=4))
    engine.add_request([5, 6, 7, 8, 9], SamplingParams(temperature=0, max_tokens=4))
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()  # nothing to do
    assert sink.events == []


def test_each_stream_rebuilds_the_whole_pool_from_its_own_events(checkpoint):
    """A second LLM.stream on the same engine starts with a full kv.pool: the first request's
    cached blocks are in it, though its own sink saw none of the earlier events."""
    llm = LLM(checkpoint("mixtral"), device=DEVICE, block_size=4)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    prompt = list(range(40, 60))
    first = [i for i in llm.stream(prompt, params, trace="basic") if isinstance(i, TraceEvent)]
    second = [i for i in llm.stream(prompt + [3, 4], params, trace="basic") if isinstance(i, TraceEvent)]
    for events in (first, second):
        pools = [e.to_dict() for e in events if e.type == "kv.pool"]
        assert pools and pools[0]["full"]
        rid = events[0].request_id
        assert all(rid in p["request_ids"] for p in pools)
    end_of_first = pool_at([e.to_dict() for e in first])
    start = pool_at([e.to_dict() for e in second], [e.step for e in second if e.type == "kv.pool"][0])
    assert sum(end_of_first["cached"]) == (len(prompt) + 5 - 1) // 4 and end_of_first["owners"] == {}
    hit = next(e for e in second if e.type == "prefix_cache.lookup").data["cached_blocks"]
    assert hit and all(start["cached"][b] for b in hit)


def test_kv_pool_events_mode_is_checked(checkpoint):
    with pytest.raises(ValueError, match="kv_pool_events"):
        LLMEngine(checkpoint("mixtral"), device=DEVICE, kv_pool_events="sometimes")


def test_a_step_looks_at_what_changed_not_the_whole_prefix_cache(checkpoint, monkeypatch):
    """A long-running server's prefix cache holds most of the pool: after a trace's first (full)
    kv.pool, a step reads the live tables and the blocks the manager touched, never the cache's
    whole list, and the events still rebuild the pool."""
    sink = EventList()
    engine = LLMEngine(checkpoint("mixtral"), device=DEVICE, tracer=Tracer(sink), trace_level="off",
                       config=EngineConfig(block_size=4, num_kv_blocks=40, max_num_seqs=4))
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    for k in range(6):  # untraced requests leave their full blocks in the prefix cache
        engine.add_request(list(range(10 + 20 * k, 30 + 20 * k)), params)
        while engine.has_unfinished_requests():
            engine.step()
    assert engine.block_manager.num_cached_blocks >= 20
    engine.add_request(list(range(10, 30)) + [3, 4, 5], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                       trace_level="basic")  # a prefix hit: cached blocks become held
    engine.step()
    pools = [e.to_dict() for e in sink.events if e.type == "kv.pool"]
    assert len(pools) == 1 and pools[0]["full"]

    def walked(*args):
        raise AssertionError("a step walked the whole prefix cache")
    monkeypatch.setattr(engine.block_manager, "cached_block_ids", walked)
    pool = apply_kv_pool(None, pools[0])
    while engine.has_unfinished_requests():
        seen = len(sink.events)
        engine.step()
        for e in sink.events[seen:]:
            if e.type == "kv.pool":
                assert not e.data["full"]
                pool = apply_kv_pool(pool, e.to_dict())
        assert same(pool, truth(engine)), engine.step_count


def test_a_decode_step_reads_the_blocks_it_wrote_not_its_whole_table(checkpoint, monkeypatch):
    """A long context holds many blocks: after the first (full) kv.pool, a decode step of one
    sequence reads the block its token went to (and the next one, as it starts), not every
    block of its table, and the events still rebuild the pool."""
    from engine.trace import kv_holders
    read = []
    real = kv_holders.Holders.update
    monkeypatch.setattr(kv_holders.Holders, "update", lambda self, live: read.append(real(self, live)) or read[-1])
    sink = EventList()
    engine = LLMEngine(checkpoint("mixtral"), device=DEVICE, tracer=Tracer(sink), trace_level="off",
                       config=EngineConfig(block_size=4, num_kv_blocks=64, max_num_seqs=4))
    engine.add_request(list(range(10, 70)), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                       trace_level="basic")  # 15 blocks of prompt
    pool = None
    while engine.has_unfinished_requests():
        seen = len(sink.events)
        engine.step()
        for e in sink.events[seen:]:
            if e.type == "kv.pool":
                pool = apply_kv_pool(pool, e.to_dict())
        assert same(pool, truth(engine)), engine.step_count
    decode = read[1:-1]  # (the first: the full look reads every table; the last: the request let all go)
    assert len(decode) >= 9 and max(len(r) for r in decode) <= 2, [sorted(r) for r in read]
    assert len(read[-1]) >= 15
