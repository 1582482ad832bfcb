"""Issue 40: a `full` trace's per-token captures (sample, embedding rows, attention, MoE
routing) are built after the answer where they are not live (engine/trace/capture_queue.py);
the stored trace ends only with the `finish` event after them, so its export holds every
token's captures. Held with the real engine (tiny Mixtral: MoE) at the page's setting."""
from __future__ import annotations

from dataclasses import replace

from app.serving.engine_service import wait_idle
from app.serving.recording import record_request
from tests.holds import AfterFinish
from tests.service_utils import answered_and_held, app_service, started

N = 10


def test_the_export_at_the_end_holds_every_tokens_captures(checkpoint, monkeypatch):
    svc = app_service(checkpoint)
    svc.engine.capture = replace(svc.engine.capture, lens_live_seconds=1e9)  # live: the first step's, the last's
    hold = AfterFinish().install(svc.engine, monkeypatch)
    with started(svc):
        rid, items, _ = answered_and_held(svc, hold, N)  # the answer is out; the work after it waits
        # the first step's and the last's (its end known before its token: StepTrace.last_step)
        assert [i["type"] for i in items].count("sample") == 2 and not svc.store.trace(rid).finished
        hold.go.set()
        assert wait_idle(svc, 60)
    rec = record_request(svc.store, rid, svc.model_info(), svc.piece, svc.is_special)
    evs = rec.events
    n_prompt = next(e for e in evs if e["type"] == "tokenize")["count"]
    answer = list(range(n_prompt, n_prompt + N))
    assert sorted(e["position"] for e in evs if e["type"] == "sample") == answer
    assert sorted(e["position"] for e in evs if e["type"] == "logit_lens") == answer
    # every pass's rows: the prompt's in the first, then each answer token but the last (no pass reads it)
    read = sorted(p for e in evs if e["type"] == "embed" for p in range(e["start"], e["start"] + e["shape"][0]))
    assert read == list(range(n_prompt + N - 1))
    attention_steps = sorted(e["step"] for e in evs if e["type"] == "attention")
    assert attention_steps == sorted(e["step"] for e in evs if e["type"] == "embed") and len(attention_steps) == N
    layers = {e["layer"] for e in evs if e["type"] == "moe"}
    assert layers and all(sorted(e["step"] for e in evs if e["type"] == "moe" and e["layer"] == layer)
                          == attention_steps for layer in layers)
    types = [e["type"] for e in evs]
    assert types.count("finish") == 1 and types.index("finish") > max(
        i for i, t in enumerate(types) if t in ("sample", "embed", "attention", "moe", "logit_lens"))
