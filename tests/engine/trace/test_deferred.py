"""A `full` trace's steps that are not live leave their keeping for later (engine/trace/
deferred.py): nothing of theirs is queued at the step; a finished request's runs in the drain
(its last token waits for none of it), everything once a cut needs the queues or past MAX_BYTES; the finished trace is the one a step-by-step
keeping gives. The engine's young collections come less often (engine/startup.py)."""
from __future__ import annotations

import gc

from engine.startup import YOUNG_THRESHOLD
from engine.trace import deferred
from tests.engine.trace.test_lens_later import PROMPT, by_position, engine_of, params


def stream(path, live, n: int):
    engine, sink = engine_of(path, live)
    rid = engine.add_request(PROMPT, params(n))
    return engine, sink, rid


def test_a_step_that_is_not_live_queues_nothing_until_the_finish(checkpoint):
    engine, sink, rid = stream(checkpoint("llama"), None, 6)  # no live step at all
    engine.step()
    engine.step()
    later, lenses = engine.step_trace.later, engine.step_trace.lenses
    assert engine.step_trace.deferred.items and not later.pending and not lenses.pending
    assert not sink.of(rid, "sample") and not sink.of(rid, "logit_lens")
    while not any(o.finished for o in engine.step()):
        pass
    # the last token's step ran none of it: the drain does, a slice a step, then the finish
    assert engine.step_trace.deferred.ended[rid] and not sink.of(rid, "finish")
    while engine.has_unfinished_requests():
        engine.step()
    assert not engine.step_trace.deferred.items
    samples = sorted(e.data["position"] for e in sink.of(rid, "sample"))
    assert samples == [d["position"] for d in by_position(sink, rid)] and len(samples) == 6
    assert len(sink.of(rid, "attention")) == 6  # one a pass: the prompt's, then each token's but the last
    kinds = [e.type for e in sink.of(rid)]
    assert kinds.index("finish") == len(kinds) - 1  # the deferred events all before the end


def test_past_max_items_the_keeping_runs_and_the_trace_is_the_same(checkpoint, monkeypatch):
    whole, sink_a, rid_a = stream(checkpoint("llama"), None, 8)
    while whole.has_unfinished_requests():
        whole.step()
    bounded, sink_b, rid_b = stream(checkpoint("llama"), None, 8)
    monkeypatch.setattr(deferred, "MAX_BYTES", 3 * bounded.step_trace._token_bytes)  # about three tokens' rows
    sizes, queued = [], []
    while bounded.has_unfinished_requests():
        bounded.step()
        sizes.append(len(bounded.step_trace.deferred.items))
        queued.append(len(bounded.step_trace.later.pending.get(rid_b, [])))
    assert 0 < max(sizes) <= 6 and max(queued) > 0  # kept in the queues before the finish
    strip = lambda sink, rid: [(e.type, e.step, {k: v for k, v in e.data.items() if "seconds" not in k})
                               for e in sink.of(rid) if e.type in ("sample", "logit_lens", "attention", "embed")]
    assert strip(sink_a, rid_a) == strip(sink_b, rid_b)


def test_the_engine_collects_its_young_objects_less_often(checkpoint):
    engine_of(checkpoint("llama"), None)
    assert gc.get_threshold()[0] >= YOUNG_THRESHOLD


def test_what_finished_requests_held_stops_counting_once_run(checkpoint, monkeypatch):
    """The bound counts what waits, not what ever waited: requests one after another, each under
    MAX_BYTES, never run the queues mid-stream (the count had grown with every finished request:
    at batch 8 on the embedded MoE a run of every queue each ~300 steps, 2026-12-07)."""
    engine, sink, _ = stream(checkpoint("llama"), None, 6)
    added = []
    real_add, real_run = deferred.Deferred.add, deferred.Deferred.run
    monkeypatch.setattr(deferred.Deferred, "add", lambda self, rid, work, args, n: added.append(n) or
                        real_add(self, rid, work, args, n))
    while engine.has_unfinished_requests():
        engine.step()
    monkeypatch.setattr(deferred, "MAX_BYTES", sum(added) * 3 // 2)  # more than one request's, less than two
    runs = []
    monkeypatch.setattr(deferred.Deferred, "run", lambda self: runs.append(len(self.items)) or real_run(self))
    for _ in range(3):
        rid = engine.add_request(PROMPT, params(6))
        while engine.has_unfinished_requests():
            engine.step()
        assert engine.step_trace.deferred.nbytes == 0 and sink.of(rid, "finish")
    assert runs == []
