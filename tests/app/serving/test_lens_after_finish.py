"""Issue 40, item 2: a traced request's client gets its last token at once; its tokens' logit
lenses are computed after it, and the store ends the trace (what is exported, written to the
database, replayed) only with the `finish` event that follows every lens. Held with the real
engine: the service's first step call after the finished output waits until the test has looked."""
from __future__ import annotations

from dataclasses import replace

from app.serving.engine_service import wait_idle
from app.serving.recording import record_request
from tests.holds import AfterFinish
from tests.service_utils import answered_and_held, app_service, started

N = 10


def test_the_client_is_told_first_and_the_stored_trace_ends_after_every_lens(checkpoint, monkeypatch):
    svc = app_service(checkpoint)
    svc.engine.capture = replace(svc.engine.capture, lens_live_seconds=1e9)  # live: the first token's, the last's
    hold = AfterFinish().install(svc.engine, monkeypatch)
    with started(svc):
        rid, items, watch = answered_and_held(svc, hold, N)  # the answer is out; the work after it waits
        # the first token's lens and the last's (its end known before it came: StepTrace.last_step)
        assert [i["type"] for i in items].count("logit_lens") == 2 and not any(i["type"] == "finish" for i in items)
        assert not svc.store.trace(rid).finished  # not yet an export's, a database's or a replay's
        assert not any(o.get("finished") for o in svc.store.trace(rid).outputs)
        hold.go.set()
        assert wait_idle(svc, 60)
        items += watch.drain(0.2)
    types = [i["type"] for i in items if i.get("request_id") == rid and i["type"] != "output"]
    assert types[-1] == "finish" and types.count("logit_lens") == N
    tr = svc.store.trace(rid)
    assert tr.finished and tr.outputs[-1]["finished"]
    rec = record_request(svc.store, rid, svc.model_info(), svc.piece, svc.is_special)
    n_prompt = next(e for e in rec.events if e["type"] == "tokenize")["count"]
    lens = sorted(e["position"] for e in rec.events if e["type"] == "logit_lens")
    assert lens == list(range(n_prompt, n_prompt + N))  # the export: a lens for every token
    assert [e["type"] for e in rec.events].index("finish") > max(
        i for i, e in enumerate(rec.events) if e["type"] == "logit_lens")
