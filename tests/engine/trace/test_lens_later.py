"""The logit lens computed after the pass (engine/trace/lens_queue.py): live only for a running
request's newest token (every lens_live_seconds), the rest after its last token. Whatever the
path (each token's at its step, the newest live and the rest after the finish, the oldest past
the byte bound), every token's lens is the same, in its printed digits; a finished trace holds
every token's lens before its `finish`, each stamped with the step that drew its token; the
client's finish output does not wait for them; and each traced step says what its tracing cost."""
from __future__ import annotations

import pytest

from engine import CaptureConfig, EventList, SamplingParams, Tracer
from engine.llm_engine import DEFAULT_MODEL, LLMEngine
from tests.engine_utils import DEVICE

PROMPT = [5, 17, 40, 9, 33, 12, 7, 21]
N = 7


def engine_of(path, live: float | None) -> tuple[LLMEngine, EventList]:
    sink = EventList()
    return LLMEngine(path, device=DEVICE, tracer=Tracer(sink), trace_level="full",
                     capture=CaptureConfig(logit_lens_top=4, lens_live_seconds=live)), sink


def params(n: int = N) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def run(path, live: float | None, n: int = N, bound: int | None = None):
    engine, sink = engine_of(path, live)
    if bound is not None:
        engine.step_trace.lenses.max_pending_bytes = bound
    rid = engine.add_request(PROMPT, params(n))
    while engine.has_unfinished_requests():
        engine.step()
    return engine, rid, sink


def by_position(sink: EventList, rid: str) -> list[dict]:
    return sorted((e.data for e in sink.of(rid, "logit_lens")), key=lambda d: d["position"])


@pytest.mark.parametrize("arch", ["llama", "embedded"])
def test_every_path_gives_every_token_the_same_lens(checkpoint, arch):
    path = DEFAULT_MODEL if arch == "embedded" else checkpoint(arch)
    _, rid, each = run(path, live=0.0)  # every token's lens at its own step, alone
    a = [e.data for e in each.of(rid, "logit_lens")]
    assert [d["position"] for d in a] == list(range(len(PROMPT), len(PROMPT) + N))
    engine, rid2, at_end = run(path, live=None)  # all of them after the last token, many tokens a call
    _, rid3, newest = run(path, live=1e9)  # the first token's live, the rest after the last token
    rows = engine.step_trace.lenses.model.model.norm.weight.numel() * 4  # one kept row's bytes (float32)
    _, rid4, bounded = run(path, live=None, bound=3 * rows)  # the oldest computed while it runs
    assert a == by_position(at_end, rid2) == by_position(newest, rid3) == by_position(bounded, rid4)
    # each lens stamped with the step that drew its token; all before the request's `finish`
    for sink, rid in ((at_end, rid2), (newest, rid3), (bounded, rid4)):
        steps = {e.data["position"]: e.step for e in sink.of(rid, "sample")}
        assert all(e.step == steps[e.data["position"]] for e in sink.of(rid, "logit_lens"))
        types = [e.type for e in sink.of(rid)]
        assert types.count("finish") == 1 and types.index("finish") > max(
            i for i, t in enumerate(types) if t == "logit_lens")
    assert not engine.step_trace.lenses.pending and not engine.step_trace.lenses.ended  # nothing left waiting


def test_the_client_gets_its_finish_before_the_lenses_and_the_trace_its_end_after(checkpoint):
    engine, sink = engine_of(checkpoint("llama"), live=1e9)  # live lenses: the first token's, and the last's
    rid = engine.add_request(PROMPT, params())
    finished = []
    while not finished:
        finished = [o for o in engine.step() if o.finished]
    assert finished[0].request_id == rid
    # the last step is live too (its end known before its token is appended): a page shows the last pass at once
    live = [e.data["position"] for e in sink.of(rid, "logit_lens")]
    assert live == [len(PROMPT), len(PROMPT) + N - 1] and not sink.of(rid, "finish")  # the rest: not yet
    steps = engine.step_count
    assert engine.has_unfinished_requests()  # the lenses still to compute keep the loop stepping
    while engine.has_unfinished_requests():
        assert engine.step() == []
    assert engine.step_count == steps and sink.of(None, "schedule.step")[-1].step <= steps  # no empty steps
    assert len(sink.of(rid, "logit_lens")) == N and sink.events[-1].type == "finish"
    assert sink.events[-1].step == finished[0].step  # stamped with the step it finished in


def test_a_finished_requests_lenses_come_a_slice_a_step_while_another_runs(checkpoint):
    engine, sink = engine_of(checkpoint("llama"), live=None)
    engine.step_trace.lenses.call_rows = 1  # a token a call: the slices show
    a = engine.add_request(PROMPT, params(4))
    b = engine.add_request(PROMPT[:5], params(4 + 6))
    while not any(o.finished and o.request_id == a for o in engine.step()):
        pass
    per_call = engine.step_trace.lenses.one_call(a)
    counts = [len(sink.of(a, "logit_lens"))]
    while not sink.of(a, "finish"):
        assert any(o.request_id == b for o in engine.step())  # b streams on meanwhile
        counts.append(len(sink.of(a, "logit_lens")))
    # one token's lens a step, none with a's finish nor while its deferred keeping runs (one slice)
    assert per_call == 1 and counts == [0, 0, 1, 2, 3, 4]


def test_every_traced_step_says_what_its_tracing_cost(checkpoint):
    engine, rid, sink = run(checkpoint("llama"), live=0.0)
    steps = sink.of(None, "schedule.step")
    traced = sink.of(None, "schedule.traced")
    assert [e.step for e in traced] == [e.step for e in steps]  # one each, the same step
    assert all(e.data["trace_seconds"] >= e.data["lens_seconds"] > 0 for e in traced)  # a lens each step
    engine, rid, sink = run(checkpoint("llama"), live=None)
    assert all(e.data["lens_seconds"] == 0 for e in sink.of(None, "schedule.traced"))  # none on a step


def test_a_reader_that_caps_the_trace_stops_the_waiting_lenses_too(checkpoint):
    engine, sink = engine_of(checkpoint("llama"), live=None)
    rid = engine.add_request(PROMPT, params())
    while not any(o.finished for o in engine.step()):
        pass
    engine.step_trace.flush()  # (its deferred keeping: a cut runs it first too)
    assert engine.step_trace.lenses.pending[rid]  # N lenses wait after the answer
    engine.stop_captures(rid, 1)  # as the server's store does once the trace passes its cap
    while engine.has_unfinished_requests():
        engine.step()
    assert not sink.of(rid, "logit_lens") and sink.events[-1].type == "finish"  # none computed; the end still comes


def test_the_live_lens_keeps_to_a_tenth_of_the_time_on_a_slow_machine(checkpoint):
    engine, sink = engine_of(checkpoint("llama"), live=0.3)
    rid = engine.add_request(PROMPT, params())
    engine.step()  # the first token: its lens live, at once
    assert len(sink.of(rid, "logit_lens")) == 1
    lenses = engine.step_trace.lenses
    lenses.live.last[rid] -= 500  # as if 500 s went by: far past the page's 0.2 s ...
    lenses.token_seconds = 100  # ... but a lens that took 100 s waits 900 s (LIVE_SHARE)
    engine.step()
    engine.step_trace.flush()  # (the step deferred its queueing: not live)
    assert len(sink.of(rid, "logit_lens")) == 1 and len(lenses.pending[rid]) == 1
    lenses.live.last[rid] -= 500  # 1,000 s since the last live lens
    engine.step()
    assert len(sink.of(rid, "logit_lens")) == 2  # the newest token's


def test_a_batchs_live_lenses_share_that_tenth(checkpoint):
    engine, sink = engine_of(checkpoint("llama"), live=0.3)
    rids = [engine.add_request(PROMPT, params()) for _ in range(2)]
    engine.step()  # both first tokens: their lenses live, at once
    assert all(len(sink.of(r, "logit_lens")) == 1 for r in rids)
    lenses = engine.step_trace.lenses
    lenses.token_seconds = 100
    for r in rids:
        lenses.live.last[r] -= 1000  # 1,000 s: one request's wait (900 s), not two's (1,800 s)
    engine.step()
    assert all(len(sink.of(r, "logit_lens")) == 1 for r in rids)
    for r in rids:
        lenses.live.last[r] -= 1000  # 2,000 s
    engine.step()
    assert all(len(sink.of(r, "logit_lens")) == 2 for r in rids)  # each newest token's
