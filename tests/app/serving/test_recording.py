"""Recorded traces: export -> import gives the same trace, replay draws every panel at
every step with no engine, classroom mode's walkthrough quotes the request's own numbers,
its presenter moves the room, and `python -m app --replay FILE` serves a file."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest

from app.page.live_view import PANELS
from app.serving.recording import Recording, ReplayCursor, TraceFileError
from app.serving.requests import build_body, parse_body
from tests.holds import StepGate
from tests.paths import ROOT
from visualizers.journey import journey


def test_export_then_import_gives_the_same_trace(service, recording):
    text = recording.dumps()
    loaded = Recording.loads(text)
    assert loaded.to_json() == recording.to_json() == json.loads(text)
    # the file holds what the engine emitted, event for event
    assert loaded.events == json.loads(json.dumps(service.store.get(recording.request_id)))
    assert [o["token_id"] for o in loaded.outputs] == [e["token_id"] for e in loaded.events if e["type"] == "token"]
    assert loaded.body["messages"][1]["content"].startswith("Tell me about <script>")
    pools = [e for e in loaded.events if e["type"] == "kv.pool"]
    assert pools and pools[0]["full"] and all(a["step"] < b["step"] for a, b in zip(pools, pools[1:]))
    assert all(recording.request_id in e["request_ids"] for e in pools)
    assert all(0 <= i < service.model_info()["vocab_size"] for i in loaded.pieces)


def test_replay_draws_every_panel_at_every_step(recording):
    cursor = ReplayCursor(recording)
    assert cursor.last_frame >= 4  # prefill, then several verify rounds
    end = cursor.goto(cursor.last_frame)
    final = {n: end.render(n) for n in PANELS}
    # the same as one view fed the whole recording at once
    whole = recording.new_view()
    whole.add(recording.items())
    assert {n: whole.render(n) for n in PANELS} == final
    counts = []
    for frame in range(cursor.last_frame + 1):
        view = cursor.goto(frame)
        counts.append(len(view.generated_ids()))
        assert all(view.render(n) for n in PANELS)
    # frame 1 is the first engine step (the prefill, which draws the first token): nothing comes before it
    assert counts[0] == 1 and counts == sorted(counts) and counts[-1] == 12
    back = cursor.goto(2)  # backwards rebuilds: equal to going there from the start
    assert len(back.generated_ids()) == counts[2]
    peak = cursor.goto(cursor.peak_kv_frame())
    owned = [b for b, rids in peak.pool["owners"].items() if recording.request_id in rids]
    assert owned and "this request holds" in peak.render("kv")
    assert "&lt;script&gt;" in final["request"] and "<script>" not in "".join(final.values())


def test_replay_counts_the_engine_steps_the_timeline_counts(recording):
    """Issue 25, item 5: one frame per engine step the request ran in (its arrival and
    tokenization, numbered with the engine's step before it, belong to frame 1), so "step k of
    N engine steps" is the timeline's N, and step 1 already shows one engine step."""
    ran = sorted({e["step"] for e in recording.events if e["type"] == "schedule.step"
                  and any(b["request_id"] == recording.request_id for b in e["batch"])})
    assert recording.steps() == ran
    cursor = ReplayCursor(recording)
    first = cursor.goto(0)
    assert first.first("tokenize") is not None and re.search(r"\b1 engine step", first.render("timeline"))
    last = cursor.goto(cursor.last_frame)
    assert f"{len(ran)} engine steps" in last.render("timeline") and cursor.last_frame + 1 == len(ran)


def test_an_abort_between_steps_adds_no_replay_step(recording):
    """Seen on the stop picture: a request stopped after its prefill (1 engine step on the
    timeline) replayed as "2 engine steps": its finish and kv.free are stamped with the step at
    whose start the abort was processed, a step that did not run it. They belong to its last frame."""
    import dataclasses
    ran = recording.steps()
    late = ran[-1] + 1
    events = [dict(e, step=late) if e["type"] in ("finish", "kv.free") else e for e in recording.events]
    end = {**recording.outputs[-1], "token_id": -1, "text": "", "finished": True, "finish_reason": "abort",
           "step": late}  # the abort's end of stream: no token of its own
    outputs = [dict(o, finished=False) for o in recording.outputs] + [end]
    aborted = dataclasses.replace(recording, events=events, outputs=outputs)
    assert aborted.steps() == ran
    cursor = ReplayCursor(aborted)
    last = cursor.goto(cursor.last_frame)
    assert last.first("finish") is not None and f"{len(ran)} engine steps" in last.render("timeline")
    assert last.finished  # its end-of-stream output came with the last frame
    waiting = dataclasses.replace(recording, events=[e for e in events if e["type"] in ("request.arrive", "tokenize",
                                                                                        "finish", "kv.free")],
                                  outputs=[{**end, "step": late + 1}])  # stopped before any step ran it (the
    assert waiting.steps() == [late + 1] and ReplayCursor(waiting).goto(0).finished  # output: the next step's number)


def test_a_file_from_before_kv_pool_events_replays_the_same(recording):
    """Older files hold the pool as "snapshots" (sparse, one per step) instead of kv.pool events."""
    from visualizers.kv_cache import apply_kv_pool
    old, pool = recording.to_json(), None
    old["events"], old["snapshots"] = [e for e in old["events"] if e["type"] != "kv.pool"], []
    for e in (e for e in recording.events if e["type"] == "kv.pool"):
        pool = apply_kv_pool(pool, e)
        old["snapshots"].append({"step": pool["step"], "num_blocks": pool["num_blocks"],
                                 "block_size": pool["block_size"], "cached": [b for b, c in enumerate(pool["cached"]) if c],
                                 "ref": {str(b): r for b, r in enumerate(pool["ref"]) if r},
                                 "owners": {str(b): o for b, o in pool["owners"].items()},
                                 "fill": {str(b): f for b, f in pool["fill"].items()}})
    loaded, now = ReplayCursor(Recording.loads(json.dumps(old))), ReplayCursor(recording)
    assert loaded.steps == now.steps and loaded.peak_kv_frame() == now.peak_kv_frame()
    for frame in (0, now.peak_kv_frame(), now.last_frame):
        assert loaded.goto(frame).render("kv") == now.goto(frame).render("kv")


def test_bad_trace_files_are_refused_with_a_reason(recording):
    good = recording.to_json()
    for bad, reason in ((b"{not json", "not a JSON file"), (b"[1, 2]", "top level"),
                        (json.dumps({**good, "schema": 9}), "schema"),
                        (json.dumps({**good, "model": {"name": "x"}}), "lacks"),
                        (json.dumps({**good, "events": [{"type": "x"}]}), "'step'"),
                        (json.dumps({**good, "events": [], "outputs": []}), "nothing was recorded"),
                        (json.dumps({**good, "pieces": {"1": 2}}), "pieces")):
        with pytest.raises(TraceFileError, match=reason):
            Recording.loads(bad)


def test_the_walkthrough_quotes_this_requests_numbers(recording):
    m = recording.model
    cursor = ReplayCursor(recording)
    peak = cursor.goto(cursor.peak_kv_frame())
    st = journey(m, recording.request_id, recording.body, recording.events, recording.outputs, peak.pool)
    keys = [s.key for s in st]
    assert keys == ["request", "tokens", "prefix", "embedding", "layers", "timeline", "kv", "logit_lens", "sampling",
                    "answer", "batching", "spec", "parallel"]  # the order a request travels: tokenize, then the cache
    assert [s.title for s in st] == [f"{i} · {s.title.split(' · ', 1)[1]}" for i, s in enumerate(st, 1)]
    text = {s.key: s.text for s in st}
    # a request still on its way has the same stages, so the presenter's stage numbers never shift
    arrival = [e for e in recording.events if e["type"] in ("request.arrive", "tokenize")]
    assert [s.key for s in journey(m, recording.request_id, recording.body, arrival, [])] == keys
    tok = next(e for e in recording.events if e["type"] == "tokenize")
    assert f"<b>{tok['count']}</b> tokens" in text["tokens"]
    per_token = 2 * m["num_layers"] * m["num_kv_heads"] * m["head_dim"] * m["dtype_bytes"]
    assert f"<b>{per_token:,}</b> bytes per token" in text["kv"]
    held = re.search(r"this request holds ([\d,]+) tokens in (\d+) blocks", peak.render("kv"))
    assert held and f"held K/V for <b>{held[1]}</b> tokens" in text["kv"] and f"<b>{held[2]}</b> blocks" in text["kv"]
    assert int(held[1].replace(",", "")) <= tok["count"] + 12 - 1  # the last token drawn is never fed back
    spec = [e for e in recording.events if e["type"] == "spec"]
    accepted = sum(e["accepted"] for e in spec)
    assert f"Over <b>{len(spec)}</b> rounds" in text["spec"] and f"kept <b>{accepted}</b>" in text["spec"]
    fin = next(e for e in recording.events if e["type"] == "finish")
    assert f"<b>{fin['usage']['completion_tokens']}</b> completion tokens" in text["answer"]
    assert f"{m['num_heads']}</b> query heads" in text["layers"]


def test_classroom_presenter_moves_the_room_and_viewers_follow(service, recording):
    from fastapi.testclient import TestClient

    from app.server import create_app
    with TestClient(create_app(service)) as client:
        room = client.post("/classroom", json={"request_id": recording.request_id}).json()
        n = len([s for s in journey(recording.model, recording.request_id, recording.body, recording.events,
                                    recording.outputs) if not s.skipped])  # the stages this request has
        assert room["stages"] == n and room["request_id"] == recording.request_id
        rid = room["id"]
        follower = client.get(room["audience_url"]).text
        presenter = client.get(room["presenter_url"]).text
        key = room["presenter_url"].split("key=")[1]
        assert "following the presenter" in follower and key not in follower and key in presenter
        assert client.get(f"/classroom/{rid}/state").json()["stage"] == 0
        wrong = client.post(f"/classroom/{rid}/goto", json={"key": "guess", "stage": 3})
        assert wrong.status_code == 403 and wrong.json()["error"]["type"] == "permission_error"
        assert client.post(f"/classroom/{rid}/goto", json={"key": key, "stage": 6}).json()["stage"] == 6
        assert client.get(f"/classroom/{rid}/state").json()["stage"] == 6
        kv = client.get(f"/classroom/{rid}/stage/6").json()["html"]
        assert "KV pages" in kv and "KV bytes = 2 × layers" in kv
        assert client.post(f"/classroom/{rid}/goto", json={"key": key, "stage": 99}).json()["stage"] == n - 1
        assert client.get(f"/classroom/{rid}/stage/{n}").status_code == 404
        assert client.get("/classroom/nope/state").status_code == 404
        assert client.post("/classroom", json={"request_id": "req-none"}).status_code == 404
        assert client.post("/classroom", json={"trace": {"schema": 1}}).status_code == 400
        assert client.post("/classroom", content=b"{nope").status_code == 400
        huge = client.post("/classroom", content=b" " * (16 * 2**20 + 1))
        assert huge.status_code == 413 and "limit" in huge.json()["error"]["message"]
        from_file = client.post("/classroom", json={"trace": recording.to_json()}).json()
        assert from_file["stages"] == n
        api = client.get(f"/v1/traces/{recording.request_id}").json()
        assert Recording.from_json(api).to_json() == recording.to_json()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # a process of its own: `python -m app --replay` starting up
def test_replay_cli_serves_a_file_with_no_model(recording, tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(recording.dumps())
    env = {**os.environ, "HOME": str(tmp_path), "GRADIO_TEMP_DIR": str(tmp_path / "gradio"),
           "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONPATH": str(ROOT)}
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    out = subprocess.run([sys.executable, "-m", "app", "--replay", str(bad)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "cannot replay" in out.stderr and "Traceback" not in out.stderr
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "app", "--replay", str(path), "--port", str(port)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, end = f"http://127.0.0.1:{port}/", time.monotonic() + 90
        while True:
            try:
                health = httpx.get(url + "healthz", timeout=2).json()
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < end, "the replay server did not start"
                time.sleep(0.3)
        assert health == {"status": "ok", "model": None, "mode": "replay", "request_id": recording.request_id}
        assert "REPLAY: no model loaded" in httpx.get(url, timeout=10).text
        for method, path in (("POST", "v1/chat/completions"), ("GET", "v1/models"), ("GET", "v1/models/x"),
                             ("DELETE", "v1/nope")):  # no engine: every /v1 route, in OpenAI's error shape
            r = httpx.request(method, url + path, json={} if method == "POST" else None, timeout=10)
            err = r.json()["error"]
            assert r.status_code == 404 and set(err) == {"message", "type", "param", "code"}
            assert "no model is loaded" in err["message"] and recording.request_id in err["message"]
        room = httpx.post(url + "classroom", json={"request_id": recording.request_id}, timeout=10).json()
        assert room["stages"] == len([s for s in journey(recording.model, recording.request_id, recording.body,
                                                         recording.events, recording.outputs) if not s.skipped])
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_classroom_on_a_running_request_follows_it_to_the_end(service, monkeypatch):
    from fastapi.testclient import TestClient

    from app.server import create_app
    gate = StepGate(at=(6,)).install(service.engine, monkeypatch)  # the room is made while the request runs
    args = dict(model="m", system="", user="Keep going.", temperature=0.0, top_k=0, top_p=1.0, max_tokens=30,
                seed=None, speculative=False, k=1, trace_level="basic")
    watch = service.submit(parse_body(build_body(**args) | {"ignore_eos": True}))
    with TestClient(create_app(service)) as client:
        try:
            assert gate.reached() == 6  # five steps done: its first tokens are in the store
            room = client.post("/classroom", json={"request_id": watch.request_id}).json()
            # the stages it has: speculation off for it and one device are skipped, known from the start
            keys = [s.key for s in journey(service.model_info(), watch.request_id, build_body(**args), [], [])
                    if not s.skipped]
            assert room["stages"] == len(keys) and "spec" not in keys
            key = room["presenter_url"].split("key=")[1]
            assert client.post(f"/classroom/{room['id']}/question",
                               json={"key": key, "action": "show"}).status_code == 200
            fin = keys.index("answer")  # its words end with why it stopped
            first = client.get(f"/classroom/{room['id']}/stage/{fin}").json()
            assert "Still running" in first["html"]
        finally:
            gate.release_all()
        end = time.monotonic() + 60
        while "It ended because" not in client.get(f"/classroom/{room['id']}/stage/{fin}").json()["html"]:
            assert time.monotonic() < end, "the room never saw the request finish"
            time.sleep(0.2)
        assert client.get(f"/classroom/{room['id']}/state").json()["version"] > first["version"]
    service.unsubscribe(watch)


def test_the_store_packs_a_finished_trace_and_reads_it_back_the_same():
    """Finished traces are kept as one JSON string (no small objects for the garbage
    collector to walk); every read gives the same events and outputs as before."""
    from app.serving.trace_store import TraceStore
    store = TraceStore(max_requests=2)
    events = [{"type": "tokenize", "request_id": "a", "step": 0, "tokens": [{"id": 1, "piece": "<x>"}]},
              {"type": "attention", "request_id": "a", "step": 1, "probs": [[[0.25, 0.75]]]}]
    for e in events:
        store.add("a", e)
    store.add_output("a", {"token_id": 5, "finished": False, "step": 1})
    assert store._traces["a"].packed is None  # still running: plain lists
    done = {"token_id": 6, "finished": True, "step": 2}
    store.add_output("a", done)
    tr = store._traces["a"]
    assert tr.packed is not None and tr.events == [] and tr.outputs == []
    got = store.trace("a")
    assert got.events == events and got.outputs[-1] == done and got.finished and store.get("a") == events
    store.add("a", {"type": "kv.free", "request_id": "a", "step": 2, "blocks": [3]})  # after the end
    assert [e["type"] for e in store.get("a")] == ["tokenize", "attention", "kv.free"]
    assert store._traces["a"].packed is not None
    store.add("b", events[0])
    store.add("c", events[0])  # only the 2 newest requests are kept
    assert store.request_ids() == ["b", "c"] and store.trace("a") is None
