"""python -m app --disaggregate: the page's service runs a traced request over both engines;
its recording keeps the handover and the page's parallelism stage draws it; a request
stopped by its client frees its blocks on both sides; stopping the service ends the
prefill process."""
from __future__ import annotations

import time

import pytest

from app.serving.requests import build_body, parse_body


@pytest.mark.slow  # the app's service and a prefill process
def test_the_app_serves_disaggregated_and_the_page_draws_the_handover(checkpoint):
    from app.serving.recording import ReplayCursor
    from tests.service_utils import app_service, record_run, started, walk

    with started(app_service(checkpoint, "--disaggregate", "--block-size", "4")) as svc:
        engine = svc.engine
        assert type(engine).__name__ == "DisaggEngine"
        rec = record_run(svc, "Tell me a story.", max_tokens=6, speculative=False)
        # a client that goes away mid-answer: the service aborts it, and both pools end empty
        body = build_body("m", "Be brief.", "Count to a hundred.", 0.0, 0, 1.0, 200, 1, False, 4, "basic")
        watch = svc.submit(parse_body(body | {"ignore_eos": True}))
        deadline = time.monotonic() + 60
        while not any(i["type"] == "output" for i in watch.drain(0.05)):
            assert time.monotonic() < deadline
        assert svc.abort(watch.request_id)
        svc.unsubscribe(watch)
        while engine.has_unfinished_requests():
            time.sleep(0.05)
        stats = engine.prefill_stats()
        assert stats["free_blocks"] == stats["num_blocks"] and stats["held"] == [] and stats["live"] == []
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        proc = engine.proc
    svc.engine.shutdown()  # what the server's exit does (ServedModels.stop)
    proc.join(10)
    assert not proc.is_alive()
    (x,) = [e for e in rec.events if e["type"] == "kv.transfer"]
    assert x["request_id"] == rec.request_id and x["num_blocks"] == len(x["dst_blocks"]) > 0
    assert {e["engine"] for e in rec.events if e["type"] == "schedule.step"} == {"prefill", "decode"}
    cursor = ReplayCursor(rec)
    panel = cursor.goto(cursor.last_frame).render("parallel")
    assert "Prefill and decode apart" in panel and f"{x['num_blocks']} blocks" in panel
    assert "Parallelism" in panel  # the stage's own panel still first
    # the stage's words (page and classroom) quote this request's handover, and the stage is not skipped
    from visualizers.journey import journey
    from visualizers.disagg import transfer_summary
    text = walk(rec)["parallel"]
    s = transfer_summary(x)
    assert "Prefill and decode apart" in text and f"{s['wire_ms']:,.2f} ms</b> on the wire" in text
    stage = next(st for st in journey(rec.model, rec.request_id, rec.body, rec.events, rec.outputs, None)
                 if st.key == "parallel")
    assert not stage.skipped and stage.chip == "2 engines"


@pytest.mark.slow  # the app's service and a prefill process
def test_two_decode_engines_number_a_requests_outputs_as_its_events(checkpoint):
    """--decode-ranks 2: one engine step runs both decode engines' steps in turn. Each streamed
    output carries the step it was made in, as its trace events do (the service stamped the
    engine's step count after the call: decode engine 1's step on decode engine 0's tokens,
    so a 10-step replay of a request there had ~19 frames, every step twice)."""
    from app.serving.recording import record_request
    from tests.service_utils import app_service, run_to_end, started

    with started(app_service(checkpoint, "--disaggregate", "--decode-ranks", "2", "--block-size", "4",
                             pace_s=0.01)) as svc:
        long = svc.submit(parse_body(build_body("m", "Be brief.", "Count to a hundred.", 0.0, 0, 1.0, 40, 1, False,
                                                4, "basic") | {"ignore_eos": True}))
        deadline = time.monotonic() + 60
        while not any(i["type"] == "output" for i in long.drain(0.05)):  # on its decode engine: the other gets the next
            assert time.monotonic() < deadline
        rid, _ = run_to_end(svc, build_body("m", "Be brief.", "Say hi.", 0.0, 0, 1.0, 10, 1, False, 4, "basic")
                            | {"ignore_eos": True})
        svc.abort(long.request_id)
        svc.unsubscribe(long)
        recs = [record_request(svc.store, r, svc.model_info(), svc.piece, svc.is_special)
                for r in (long.request_id, rid)]
    both = sorted(e["dst"] for rec in recs for e in rec.events if e["type"] == "kv.transfer")
    assert both == ["decode 0", "decode 1"]
    for rec in recs:
        tokens = {e["index"]: e["step"] for e in rec.events if e["type"] == "token"}
        made = [o for o in rec.outputs if o["token_id"] >= 0]
        assert made and [o["step"] for o in made] == [tokens[o["index"]] for o in made], rec.request_id
        # a frame per step that ran it: its outputs add none of their own
        assert set(rec.steps()) == {e["step"] for e in rec.events if e["type"] not in ("kv.pool", "request.arrive",
                                                                                       "tokenize", "finish", "kv.free")}
