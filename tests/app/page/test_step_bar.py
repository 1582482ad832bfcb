"""The replay bar's step slider where there is little to scrub: a Gradio slider needs min <
max, so one engine step drew a 0..1 slider labelled "engine step 1..1" (G 1400 stop), and a
request stopped before any step "1..1 (1 engine step)" where its timeline counts none (S 1400
stop). There the slider is hidden and a sentence says what there is (the browser side is in
test_browser_pictures.py)."""
from __future__ import annotations

from app.page.step_bar import steps_updates
from app.serving.recording import Recording, ReplayCursor

MODEL = {"name": "tiny", "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "head_dim": 4, "d_model": 8,
         "vocab_size": 32, "is_moe": False}
ARRIVE = [{"type": "request.arrive", "step": 3, "trace_level": "full", "messages": []},
          {"type": "tokenize", "step": 3, "ids": [1, 2, 3]}]


def end(step: int, token: int = -1) -> dict:
    return {"type": "output", "token_id": token, "text": "", "finished": True, "finish_reason": "abort", "index": 0,
            "t": 0.0, "step": step}


def bar(events: list[dict], outputs: list[dict]) -> dict:
    cur = ReplayCursor(Recording("r1", MODEL, None, events, outputs))
    cur.goto(cur.last_frame)
    return steps_updates(cur)


def test_a_request_stopped_before_any_step_has_no_slider_and_says_so():
    out = bar(ARRIVE + [{"type": "finish", "step": 3, "reason": "abort"}], [end(4)])
    assert out["step"]["visible"] is False and out["step_box"]["visible"] is False
    note = out["step_note"]["value"]
    assert out["step_note"]["visible"] and "no engine step to replay" in note and "1..1" not in note, note


def test_one_engine_step_has_no_slider_and_two_have_one_from_1():
    one = bar(ARRIVE + [{"type": "schedule.step", "step": 4}], [end(4, token=5)])
    assert one["step"]["visible"] is False and "one engine step" in one["step_note"]["value"]
    two = bar(ARRIVE + [{"type": "schedule.step", "step": 4}, {"type": "schedule.step", "step": 5}],
              [{**end(4, token=5), "finished": False}, end(5, token=6)])
    assert two["step"]["visible"] and two["step"]["minimum"] == 1 and two["step"]["maximum"] == 2
    assert two["step_box"]["visible"] and two["step_note"]["visible"] is False
    assert steps_updates(None)["step"]["visible"] is False
    assert "nothing to replay yet" in steps_updates(None)["step_note"]["value"]
