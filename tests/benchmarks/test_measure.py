"""benchmarks.measure's figures without a browser: what each follower's marks mean, the
percentiles it prints, the lag cut in three, and the periods it can set."""
from __future__ import annotations

import pytest

from app.page import live_view, stages
from benchmarks import measure


def test_p99_is_a_rank_not_the_max():
    xs = sorted(float(i) for i in range(1, 101))
    assert measure.percentile(xs, 0.99) == 99 and measure.percentile(xs, 0.95) == 95
    assert measure.percentile([5.0], 0.99) == 5


def test_a_late_token_fails_and_a_missing_one_fails():
    assert measure.lag_line([100, 200, 499], 0).endswith("PASS")
    assert measure.lag_line([100, 200, 501], 0).endswith("FAIL")
    assert measure.lag_line([100], 1).endswith("FAIL")  # never seen
    assert "p99 " in measure.lag_line([100, 200], 0)


def test_each_followers_marks_are_keyed_as_the_engines_events():
    seen = {"r:3": 10.0}
    assert measure.as_tokens("map", seen, {}) == {"r:2": 10.0}  # "3 tokens": token index 2 shown
    assert measure.as_tokens("timeline", seen, {}) == {"r:3": 10.0}  # "3 engine steps": the 3rd step
    assert measure.as_tokens("pass", {"r:12": 7.0}, {"r": 10}) == {"r:2": 7.0}  # predicted position 12
    assert measure.as_tokens("token", seen, {}) == seen


def test_a_panel_that_never_follows_fails_its_line():
    produced = {"r:0": 0.0, "r:1": 100.0}
    seen = {"token": {"r:0": 200.0, "r:1": 300.0}, "map": {"r:1": 250.0}}  # the map counted 1 token only
    lines = measure.follow_lines(produced, {}, seen, {}, ["r"])
    assert lines[0].startswith("answer") and lines[0].endswith("PASS")
    assert next(x for x in lines if x.startswith("map")).endswith("FAIL")  # token 1 never counted


def test_the_lag_is_cut_in_three():
    produced, yielded, seen = {"r:0": 0.0}, {"r:0": 50.0}, {"r:0": 400.0}
    line = measure.where_it_goes(produced, yielded, [[150.0, [0]]], seen, ["r"])
    assert "server yield median 50" in line and "browser median 100" in line and "on screen median 250" in line


def test_periods_are_set_and_refused_by_name(monkeypatch):
    monkeypatch.setattr(live_view, "ONE_PASS_EVERY", live_view.ONE_PASS_EVERY)
    monkeypatch.setattr(stages, "JOURNEY_EVERY", stages.JOURNEY_EVERY)
    monkeypatch.setattr(live_view, "HEAVY", dict(live_view.HEAVY))
    got = measure.set_periods("one_pass=0.45,journey=0.3,timeline=0.3")
    assert got["one_pass"] == 0.45 and live_view.ONE_PASS_EVERY == 0.45 and live_view.HEAVY["timeline"] == 0.3
    assert measure.set_periods("timeline=0")["timeline"] == 0 and "timeline" not in live_view.HEAVY
    with pytest.raises(SystemExit):
        measure.set_periods("nonsense=1")


def test_every_answer_runs_to_its_max_tokens(checkpoint):
    """The page's worst case is the full length: an answer the embedded model would end early
    (its end of text at once) runs on to max_tokens."""
    from app.serving.requests import build_body, parse_body
    from tests.service_utils import app_service
    service = app_service(checkpoint, "--draft", "none", model=None)  # the embedded model
    eos = service.engine.model_config.eos_token_ids[0]
    body = build_body("m", "", "Say nothing.", 0.0, 0, 1.0, 12, 1, False, 1, "off")
    body["logit_bias"] = {str(eos): 100}  # end of text first, whatever the model would say
    sub = parse_body(body)
    params = sub.params
    rid = service.engine.add_request(prompt=sub.prompt, messages=sub.messages, params=params)
    while service.engine.has_unfinished_requests():
        service.engine.step()
    assert service.engine.get_output(rid).finish_reason == "stop"
    measure.full_length(service)
    rid = service.engine.add_request(prompt=sub.prompt, messages=sub.messages, params=params)
    while service.engine.has_unfinished_requests():
        service.engine.step()
    out = service.engine.get_output(rid)
    assert (out.finish_reason, len(out.token_ids)) == ("length", 12)
