"""The page's controller without a browser: the named controls, the journey's map and
sections, replay numbering and clamping, and the controls a replay or a watched request
fills (issue 25, items 4-7 and "What must hold" 1, 6, 7, 9)."""
from __future__ import annotations

import time

import pytest

from app.page.controller import Controller, Controls
from app.page.live_view import PANELS
from visualizers.journey import KEYS

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")


@pytest.fixture(scope="module")
def ctl(service):
    return Controller(service)


@pytest.fixture
def trace_file(recording, tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(recording.dumps())
    return path


def value(update):
    return update.get("value") if isinstance(update, dict) else update


def test_controls_are_named_and_keep_their_defaults():
    c = Controls.of({"user": "Hi", "temperature": 0.0, "nonsense": 1})
    assert c.user == "Hi" and c.temperature == 0.0 and c.level == "full" and not hasattr(c, "nonsense")


def test_the_opening_page_draws_the_map_and_one_section_per_stage(ctl):
    out = ctl.opening_page("opening")
    assert set(out) >= {"map"} | {f"stage:{k}" for k in KEYS} | {f"section:{k}" for k in KEYS}
    chips = out["map"].count("tt-map-chip")
    shown = [k for k in KEYS if out[f"section:{k}"]["visible"]]
    assert chips == len(shown) >= 10  # a chip for each stage not skipped
    assert out["map"].index("Tokenize") < out["map"].index("Prefix cache")  # tokenize first


def test_the_status_counts_one_token_in_the_singular(ctl):
    """Seen on SmolLM2's stop picture: "finished (abort), 1 tokens"."""
    c = Controls(user="Tell me about foxes.", max_tokens=1, seed="3", level="off", model=ctl.model["name"])
    statuses = [u["status"] for u in ctl.run("one-token", c) if "status" in u]
    assert statuses[-1].endswith("finished (length), 1 token"), statuses
    assert not any("1 tokens" in s for s in statuses), statuses


def test_a_stream_redraws_the_map_and_stages_while_it_runs(ctl, monkeypatch):
    monkeypatch.setattr("app.page.stages.JOURNEY_EVERY", 0.0)  # every update: the tiny model is fast
    c = Controls(user="Tell me about foxes.", max_tokens=12, seed="3", level="full", model=ctl.model["name"])
    updates = list(ctl.run("streamer", c))
    statuses = [u["status"] for u in updates if "status" in u]
    assert "finished" in statuses[-1], statuses
    assert next(u for u in updates if "stop" in u)["stop"]["variant"] == "stop"  # red while it runs ...
    done = next(u for u in updates if "finished" in u.get("status", "") and "stop" in u)
    assert done["stop"]["variant"] == "secondary"  # ... and not once it is over
    maps = [u["map"] for u in updates if "map" in u]
    assert maps and "tt-map-lit" in maps[-1]
    assert all(value(updates[-1][n]) for n in PANELS)  # the last update carries every panel
    assert updates[-1]["step"]["label"].startswith("Replay: engine step 1..")
    assert "nothing to replay" not in updates[-1]["step"]["label"]
    # scrubbing the finished request replays it: the controls show its own settings, read-only
    ctl.preview("streamer", Controls(user="edited since"))  # a request is shown: the preview leaves it alone
    back = ctl.goto("streamer", 1, Controls())
    assert "step 1 of" in back["status"] and back["send"]["interactive"] is False
    assert value(back["user"]) == "Tell me about foxes." and back["unlock"]["visible"] is True


def test_replay_numbers_steps_and_clamps_a_step_past_the_end(ctl, recording, trace_file):
    out = ctl.load_trace("loader", str(trace_file))
    n = len(recording.steps())
    assert f"step {n} of {n} engine steps" in out["status"]
    assert out["step"]["maximum"] == n and out["step"]["minimum"] == 1
    clamped = ctl.goto("loader", n + 2, Controls())
    assert f"step {n} of {n} engine steps" in clamped["status"] and f"no step {n + 2}" in clamped["status"]
    assert "error" not in clamped["status"].lower() and value(clamped["step"]) == n
    low = ctl.goto("loader", 0, Controls())
    assert f"step 1 of {n} engine steps" in low["status"]
    first = ctl.goto("loader", 1, Controls())
    assert "step 1 of" in first["status"] and "0 engine steps" not in first["timeline"]


def test_a_loaded_trace_fills_the_controls_read_only(ctl, recording, trace_file):
    out = ctl.load_trace("filler", str(trace_file))
    assert value(out["user"]) == recording.body["messages"][-1]["content"]
    assert value(out["temperature"]) == pytest.approx(0.8) and value(out["seed"]) == "3"
    assert value(out["level"]) == "full"
    for name in ("user", "temperature", "seed", "level", "send"):
        assert out[name]["interactive"] is False, name
    assert out["unlock"]["visible"] is True
    back = ctl.unlock("filler", Controls(user="again", model=ctl.model["name"]))
    assert back["user"]["interactive"] is True and back["send"]["interactive"] is True
    assert back["unlock"]["visible"] is False


def test_watch_fills_the_controls_with_the_watched_request(ctl, service):
    from app.serving.requests import build_body, parse_body
    gen = ctl.follow("watcher", Controls(model=ctl.model["name"]))
    first = next(gen)
    assert "watching" in first["status"] and first["send"]["interactive"] is False  # read-only while watching
    assert first["user"]["interactive"] is False and first["temperature"]["interactive"] is False
    body = build_body("m", "Be brief.", "Watched <b>prompt</b>", 0.0, 0, 1.0, 6, 7, False, 1, "basic")
    service.submit(parse_body(body))
    end, seen = time.monotonic() + 60, {}
    for u in gen:
        seen.update(u)
        if "waiting for the next request" in str(u.get("status", "")) or time.monotonic() > end:
            break
    gen.close()
    assert value(seen["user"]) == "Watched <b>prompt</b>" and value(seen["temperature"]) == 0.0
    assert value(seen["level"]) == "basic" and value(seen["seed"]) == "7"


def test_the_first_update_resets_the_hints_and_draws_the_request_in_one(ctl):
    """Each update of Send costs a Gradio round of every output; the hints' reset came in an
    update of its own before the stream's first, and the first tokens waited behind both
    (benchmarks.measure: the first tokens of a request were the slowest)."""
    c = Controls(user="Tell me about foxes.", max_tokens=4, seed="3", level="full", model=ctl.model["name"])
    updates = list(ctl.run("one-round", c))
    first = updates[0]
    assert first["hint_send"] == "" and first["export"]["interactive"] is False  # the last request's leftovers
    assert set(first) >= set(PANELS) and "queued" in first["status"]  # ... and the new request, in one update
