"""More than one engine a side (xPyD): P prefill processes, D decode engines in the serving
process, one torch.distributed group. The tokens stay one colocated engine's, the requests
spread over the engines (read from each request's kv.transfer: its source and destination),
the prefix cache is found again on the prefill engine that holds it, and every pool ends empty;
the trace names each engine, the Perfetto export gives each its track and the panel draws
the P + D pools."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, EventList, SamplingParams
from engine.disagg import engine as disagg_engine
from engine.disagg.routing import pick_decode
from tests.paths import ROOT
from visualizers.disagg import disagg_html
from visualizers.perfetto import perfetto_trace

EMBEDDED = ROOT / "assets" / "models" / "target"
_g = torch.Generator().manual_seed(29)
# no shared prefix; each at least 17 tokens (a prompt's cached home beats another engine's load:
# see the routing test)
PROMPTS = [torch.randint(4, 300, (n,), generator=_g).tolist() for n in (21, 26, 33, 18)]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
SEEDED = [SamplingParams(temperature=0.9, top_p=0.9, seed=s, max_tokens=8, ignore_eos=True) for s in (3, 4, 5, 6)]
LAYOUTS = [(2, 1), (1, 2), (2, 2)]


def pools_empty(llm: LLM) -> None:
    """Every prefill pool and every decode pool holds nothing."""
    e = llm.engine
    for d in e.decode_stats():
        assert d["free_blocks"] == d["num_blocks"] and d["running"] == d["waiting"] == 0
    stats = e.prefill_stats()
    assert len(stats["engines"]) == len(e.procs)
    assert stats["free_blocks"] == stats["num_blocks"] and stats["held"] == [] and stats["live"] == []
    assert not e.remote and not e.ready and not e.inflight


@pytest.fixture(scope="module")
def colocated():
    one = LLM(EMBEDDED, device="cpu", dtype="float32", block_size=4)
    greedy = one.generate(PROMPTS, GREEDY)
    return [o.token_ids for o in greedy], one.generate(PROMPTS, SEEDED)


@pytest.mark.slow  # P prefill processes
@pytest.mark.parametrize("p,d", LAYOUTS, ids=[f"{p}P{d}D" for p, d in LAYOUTS])
def test_several_engines_a_side_give_one_engines_tokens_and_share_the_requests(colocated, p, d):
    want_greedy, want_seeded = colocated
    with LLM(EMBEDDED, device="cpu", dtype="float32", block_size=4, disaggregate=True, prefill_ranks=p,
             decode_ranks=d) as llm:
        sink = EventList()
        llm.tracer.add_sink(sink)
        assert len(llm.engine.procs) == p and len(llm.engine.lanes) == d
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY, trace_level="basic")] == want_greedy
        # what the prefill side holds now, as its router's record says (whole blocks, one token left)
        assert [llm.engine.cached_prefix_tokens(x) for x in PROMPTS] == [(len(x) - 1) // 4 * 4 for x in PROMPTS]
        assert llm.engine.cached_prefix_tokens(PROMPTS[0][:8] + [1, 2, 3, 4, 5]) == 8
        seeded = llm.generate(PROMPTS, SEEDED, trace_level="basic")
        assert [o.token_ids for o in seeded] == [o.token_ids for o in want_seeded]
        # the second round found each prompt's blocks again: routed to the prefill engine that holds them
        assert [o.usage.cached_tokens for o in seeded] == [o.usage.cached_tokens for o in want_seeded] == \
            [(len(x) - 1) // 4 * 4 for x in PROMPTS]
        xs = [e.data for e in sink.events if e.type == "kv.transfer"]
        assert len(xs) == 2 * len(PROMPTS)
        assert {x["src"] for x in xs} == {f"prefill {k}" for k in range(p)}  # every engine had requests
        assert {x["dst"] for x in xs} == {f"decode {j}" for j in range(d)}
        assert all(x["src_rank"] == int(x["src"].split()[1]) + 1 and x["dst_rank"] == 0 for x in xs)
        assert all([q["engine"] for q in x["pools"]] == [f"prefill {k}" for k in range(p)] +
                   [f"decode {j}" for j in range(d)] for x in xs)
        by_request = {}
        for x in xs:  # each prompt went to one prefill engine in both rounds: where its blocks were
            by_request.setdefault(x["tokens"], set()).add(x["src"])
        assert all(len(srcs) == 1 for srcs in by_request.values())
        pools_empty(llm)
    assert not any(proc.is_alive() for proc in llm.engine.procs)


def one_each(monkeypatch) -> None:
    """The router's decode choice held: among the decode engines given no request yet, the
    one pick_decode takes (the first request could otherwise end and free its blocks on
    decode 0 before the second's pages are ready, on a slow machine, and both go there)."""
    chosen: list[int] = []

    def pick(free_blocks: list[int], needed: int) -> int | None:
        fresh = [-1 if i in chosen else free for i, free in enumerate(free_blocks)]
        j = pick_decode(fresh, needed)
        j = pick_decode(free_blocks, needed) if j is None else j  # every engine had one: the router's own pick
        if j is not None:
            chosen.append(j)
        return j
    monkeypatch.setattr(disagg_engine, "pick_decode", pick)


@pytest.mark.slow  # 2 prefill processes
def test_each_engine_has_its_name_its_track_and_its_pool_on_the_page(monkeypatch):
    one_each(monkeypatch)
    with LLM(EMBEDDED, device="cpu", dtype="float32", block_size=4, disaggregate=True, prefill_ranks=2,
             decode_ranks=2) as llm:
        sink = EventList()
        llm.tracer.add_sink(sink)
        outs = llm.generate(PROMPTS[:2], GREEDY, trace_level="basic")
        pools_empty(llm)
    events = [e.to_dict() for e in sink.events]
    xs = {e["request_id"]: e for e in events if e["type"] == "kv.transfer"}
    # one each (held by one_each; which request got decode 0 depends on which READY came first)
    assert sorted(x["src"] for x in xs.values()) == ["prefill 0", "prefill 1"]
    assert sorted(x["dst"] for x in xs.values()) == ["decode 0", "decode 1"]
    steps = [e for e in events if e["type"] == "schedule.step"]
    assert {(s["engine"], s["engine_index"]) for s in steps} == {("prefill", 0), ("prefill", 1), ("decode", 0),
                                                                  ("decode", 1)}
    # each pool's events under its own name: the page folds decode 0's kv.pool, the others travel renamed
    assert {e["engine_index"] for e in events if e["type"] == "kv.pool"} == {0}
    assert {e["engine_index"] for e in events if e["type"] == "kv.decode_pool"} == {1}
    assert {e["engine_index"] for e in events if e["type"] == "kv.prefill_pool"} == {0, 1}
    for out in outs:
        x = xs[out.request_id]
        trace = perfetto_trace(events, out.request_id, "embedded")
        names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
        src, dst = x["src"], x["dst"]
        assert {f"{src} engine steps", f"{dst} engine steps", f"KV transfer ({src} -> {dst})"} <= names
        tids = {e["tid"] for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "engine"}
        assert len(tids) == 2  # its two engines, a track each
        html = disagg_html([x])
        for name in ("prefill engine 0's pool", "prefill engine 1's pool", "decode engine 0's pool",
                     "decode engine 1's pool"):
            assert name.replace("'", "&#x27;") in html
        assert html.count("blocks of this request (marked)") == 2 and html.count("not this request&#x27;s") == 2
        assert f"computed on <b>prefill engine {src[-1]}</b>" in html and "4 engines" in html
