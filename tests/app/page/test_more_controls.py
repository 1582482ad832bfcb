"""The page's extra sampling controls (issue 26, part 6): penalties, min_p / min_tokens, a logit
bias on a clicked token, JSON mode with the grammar's mask in the sampling stage, and n choices
side by side; and the client's slot of an n > 1 request, held until its last choice ends."""
from __future__ import annotations

import json

import pytest

import visualizers as viz
from app.page.controller import Controller, Controls, more_fields
from app.serving.recording import Recording, ReplayCursor, TraceFileError
from app.serving.requests import parse_body

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")
# a grammar that leaves one answer: the tiny random model must end by stop with exactly this JSON
ONLY = json.dumps({"type": "object", "properties": {"a": {"enum": ["x"]}}, "required": ["a"],
                   "additionalProperties": False})


@pytest.fixture(scope="module")
def ctl(service):
    return Controller(service)


def value(update):
    return update.get("value") if isinstance(update, dict) else update


def run(ctl, key: str, c: Controls) -> dict:
    seen: dict = {}
    for u in ctl.run(key, c):
        seen.update(u)
    return seen


def test_the_controls_become_the_api_fields_and_neutral_knobs_send_nothing():
    assert more_fields(Controls()) == {}
    c = Controls(presence_penalty=0.5, frequency_penalty=-0.3, repetition_penalty=1.2, min_p=0.05, min_tokens=3,
                 bias_token="17", bias=-100, json_mode="JSON schema", schema=ONLY, n=3)
    got = more_fields(c)
    assert got == {"presence_penalty": 0.5, "frequency_penalty": -0.3, "repetition_penalty": 1.2, "min_p": 0.05,
                   "min_tokens": 3, "logit_bias": {"17": -100.0}, "n": 3,
                   "response_format": {"type": "json_schema", "json_schema": {"name": "answer",
                                                                              "schema": json.loads(ONLY)}}}
    sub = parse_body({"model": "m", "messages": [{"role": "user", "content": "hi"}], **got})
    assert sub.params.logit_bias == {17: -100.0} and sub.params.n == 3 and sub.params.structured.kind == "json_schema"
    assert more_fields(Controls(bias_token="17", bias=0)) == {}  # a bias of 0 is no bias


def test_a_bad_schema_or_token_id_is_refused_under_the_controls(ctl):
    out = run(ctl, "bad-schema", Controls(json_mode="JSON schema", schema="{not json", model=ctl.model["name"]))
    assert "not valid JSON" in out["hint_more"] and "rejected" in out["status"]
    out = run(ctl, "bad-token", Controls(bias_token="fox", bias=5, model=ctl.model["name"]))
    assert "logit_bias" in out["hint_more"]
    out = run(ctl, "far-token", Controls(bias_token="999999", bias=5, model=ctl.model["name"]))
    assert "logit_bias token ids must be in" in out["hint_more"] and not out["hint_prompt"]  # the engine's check


def test_a_clicked_candidate_becomes_the_biased_token(ctl):
    out = ctl.pick_bias("picker", "7:123", Controls(bias=0))
    assert value(out["bias_token"]) == "7" and value(out["bias"]) == -100.0 and out["more_box"]["open"] is True
    assert "id 7" in out["hint_more"]
    assert value(ctl.pick_bias("picker", "7:124", Controls(bias=4))["bias"]) == 4.0  # a bias set stays
    assert ctl.pick_bias("picker", "nonsense", Controls()) == {}


def test_json_mode_with_a_penalty_parses_and_the_sampling_stage_shows_the_mask_and_the_penalty(ctl):
    c = Controls(user="Give me JSON.", max_tokens=24, temperature=0.0, json_mode="JSON schema", schema=ONLY,
                 presence_penalty=1.0, repetition_penalty=1.3, bias_token="5", bias=-50, level="basic",
                 model=ctl.model["name"])
    out = run(ctl, "json", c)
    assert "finished (stop)" in out["status"], out["status"]
    tab = ctl.sessions.get("json")
    answer = "".join(o["text"] for o in tab.view.outputs)
    assert json.loads(answer) == {"a": "x"}
    html = tab.view.render("sampling")
    for label in ("grammar mask", "repetition penalty", "logit bias", "allowed"):
        assert label in html, label
    assert "data-stage='grammar'" in html and "data-stage='repetition_penalty'" in html
    # presence penalty: a row once the answer holds a token (the newest pass has one)
    assert "presence penalty" in html
    spec = next(s for s in tab.view.events if s["type"] == "sample")  # the engine ran without speculation
    assert "grammar" in spec["stages"]
    stages = ctl.opening_page("json")
    assert "Speculation" in stages["map"].split("skipped by this request:")[-1]


def test_n_choices_stream_side_by_side_and_the_slot_is_held_until_the_last_ends(ctl, service):
    service.slots.limit = 1  # this test's client may have one request in flight
    try:
        gen = ctl.run("choices", Controls(user="Tell me about foxes.", max_tokens=10, temperature=1.0, seed="4",
                                          n=3, level="basic", model=ctl.model["name"]), client="10.0.0.9")
        seen: dict = {}
        held_after_choice0 = []
        for u in gen:
            seen.update(u)
            tab = ctl.sessions.get("choices")
            if tab is not None and tab.view.own_done and not tab.view.finished:
                held_after_choice0.append(service.slots.in_flight("10.0.0.9"))
        assert "finished" in seen["status"]
        html = value(seen["choices"])
        assert html.count("class='tt-choice'") == 3 and html.count("finished:") == 3
        assert service.slots.in_flight("10.0.0.9") == 0
        assert all(h == 1 for h in held_after_choice0)  # choice 0 ended, the others ran: still held
        live = tab.view.choice_outputs()
        # replayed, every choice is drawn side by side as it was live (the recording keeps each
        # choice's outputs, not only choice 0's trace), at the last step all three finished
        frames = len(ctl.sessions.get("choices").cursor.steps)
        last = ctl.goto("choices", frames, Controls())
        assert value(last["n"]) == 3 and last["n"]["interactive"] is False  # the controls show its own n
        assert "asked for 3 choices" not in last["choices"]
        assert last["choices"].count("class='tt-choice'") == 3 and last["choices"].count("finished:") == 3
        for outs in live:
            assert viz._html.esc("".join(o["text"] for o in outs)) in last["choices"]
        # at step 1 (choice 0's prefill) no choice had finished yet
        first = ctl.goto("choices", 1, Controls())
        assert first["choices"].count("class='tt-choice'") == 3 and "finished:" not in first["choices"]
        # the exported file loads with its choices; a file of before (no "choices") says what it lacks
        rec = ctl.sessions.get("choices").cursor.rec
        assert len(rec.choices) == 2 and all(o["request_id"] == f"{rec.request_id}.{i}" for i, outs in
                                             enumerate(rec.choices, 1) for o in outs)
        again = Recording.loads(rec.dumps())
        assert again.choices == rec.choices and ReplayCursor(again).steps == ctl.sessions.get("choices").cursor.steps
        old = {k: v for k, v in json.loads(rec.dumps()).items() if k != "choices"}
        view = ReplayCursor(Recording.from_json(old)).goto(10**6)
        assert "asked for 3 choices" in view.render("choices")
        bad = {**old, "choices": [[{**rec.choices[0][0], "request_id": rec.request_id}]]}  # choice 1 as choice 0
        with pytest.raises(TraceFileError, match="'choices'"):
            Recording.from_json(bad)
    finally:
        service.slots.limit = None


def test_the_slot_of_n_choices_is_freed_only_when_the_last_ends(service):
    """The service alone, driven by hand: choice 0's end does not free the client's slot."""
    from app.serving.limits import ClientSlots
    slots = ClientSlots(1)
    old = service.slots
    service.slots = slots
    try:
        rid = "slot-test"
        slots.acquire("c", rid)
        service._parent[f"{rid}.1"] = rid
        service._open_choices[rid] = {rid, f"{rid}.1"}
        service._release_slot({"request_id": rid, "finished": True})
        assert slots.in_flight("c") == 1  # choice 1 still runs
        service._release_slot({"request_id": f"{rid}.1", "finished": True})
        assert slots.in_flight("c") == 0 and rid not in service._open_choices
    finally:
        service.slots = old


def test_watch_follows_every_choice_of_an_n_request(ctl, service):
    import time

    from app.serving.requests import build_body
    gen = ctl.follow("watch-n", Controls(model=ctl.model["name"]))
    assert "watching" in next(gen)["status"]
    body = {**build_body("m", "", "Watched foxes", 1.0, 0, 1.0, 6, 3, False, 1, "basic"), "n": 2}
    service.submit(parse_body(body))
    end, seen = time.monotonic() + 60, {}
    for u in gen:
        seen.update(u)
        if "waiting for the next request" in str(u.get("status", "")) or time.monotonic() > end:
            break
    gen.close()
    html = value(seen["choices"])
    assert html.count("class='tt-choice'") == 2 and html.count("finished:") == 2, html
    assert value(seen["n"]) == 2
