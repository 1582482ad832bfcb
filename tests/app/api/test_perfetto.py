"""The timeline for Perfetto (GET /v1/traces/{id}/perfetto, visualizers/perfetto.py): Chrome
trace-event JSON whose complete slices, read back from the file, are the recording's engine
steps and phases, the request's own steps with their kinds and tokens, its batch neighbours
and its queue time; slices on one track nest; unknown ids get an OpenAI-shaped 404."""
from __future__ import annotations

import json
import threading
import time

import pytest

from app.serving.recording import record_request
from app.serving.requests import build_body, parse_body
from tests.service_utils import app_service, started

US = 1e6


@pytest.fixture(scope="module")
def service(checkpoint):
    # a 6-token budget chunks the prompt, so the request has several prefill steps as well as decodes
    with started(app_service(checkpoint, "--num-kv-blocks", "64", "--block-size", "4", "--max-num-batched-tokens", "6",
                             model="llama")) as svc:
        yield svc


def submit(service, user: str, max_tokens: int):
    body = build_body(model="m", system="", user=user, temperature=0.0, top_k=0, top_p=1.0, max_tokens=max_tokens,
                      seed=None, speculative=False, k=1, trace_level="basic") | {"ignore_eos": True}
    return service.submit(parse_body(body))


def wait(service, watch) -> None:
    end = time.monotonic() + 60
    items = []
    while not any(i["type"] == "output" and i["finished"] for i in items):
        assert time.monotonic() < end, "the request did not finish"
        items += watch.drain(0.05)
    service.unsubscribe(watch)


@pytest.fixture(scope="module")
def two(service):
    """Two requests at once: each is the other's batch neighbour in the steps they share. Both are
    added before the engine's next step (its lock held): submitted one after the other, the
    first could finish before the second arrived on a loaded machine (seen once: no neighbour)."""
    with service.engine.lock:
        a = submit(service, "The quick brown fox jumps over the lazy dog again and again", 10)
        b = submit(service, "Hello there", 10)
    threads = [threading.Thread(target=wait, args=(service, w)) for w in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(0.1)
    return a.request_id, b.request_id


def nests(slices: list[dict]) -> bool:
    """Complete slices on one track: any two are disjoint or one holds the other."""
    for i, x in enumerate(slices):
        for y in slices[i + 1:]:
            xa, xb, ya, yb = x["ts"], x["ts"] + x["dur"], y["ts"], y["ts"] + y["dur"]
            if not (xb <= ya + 1e-3 or yb <= xa + 1e-3 or (xa <= ya and yb <= xb + 1e-3)
                    or (ya <= xa and xb <= yb + 1e-3)):
                return False
    return True


def test_the_file_loads_back_with_the_recordings_steps_phases_neighbours_and_queue(service, two):
    from fastapi.testclient import TestClient

    from app.server import create_app
    rid, other = two
    rec = record_request(service.store, rid, service.model_info(), service.piece, service.is_special)
    with TestClient(create_app(service)) as client:
        r = client.get(f"/v1/traces/{rid}/perfetto")
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
        trace = json.loads(r.text)
        missing = client.get("/v1/traces/req-none/perfetto")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "trace_not_found"
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    tid = {v: k for k, v in names.items()}
    assert {"engine steps", f"request {rid}", f"neighbour {other}"} <= set(tid)
    xs = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["pid"] == 1 for e in xs)
    track = {t: [e for e in xs if e["tid"] == t] for t in names}
    assert all(nests(s) for s in track.values())

    steps = [e for e in rec.events if e["type"] == "schedule.step" and any(b["request_id"] == rid for b in e["batch"])]
    arrive = next(e for e in rec.events if e["type"] == "request.arrive")
    tok = next(e for e in rec.events if e["type"] == "tokenize")
    t0 = arrive["tokenized_at"] - tok["seconds"]  # the event itself may wait for the lock
    engine = track[tid["engine steps"]]
    for s in steps:  # each step and its phases, where and as long as the recording says
        step = next(e for e in engine if e["name"] == f"step {s['step']}")
        assert step["ts"] == pytest.approx((s["start"] - t0) * US, abs=0.01)
        phases = {e["name"]: e for e in engine if e["cat"] == "phase" and e["args"]["step"] == s["step"]}
        assert set(phases) >= {"schedule", "forward", "sample"}
        for name, key in (("schedule", "schedule_seconds"), ("forward", "forward_seconds"),
                          ("sample", "sample_seconds")):
            assert phases[name]["dur"] == pytest.approx(s[key] * US, abs=0.01)
        assert phases["schedule"]["ts"] == step["ts"]
        assert phases["sample"]["ts"] == pytest.approx(phases["forward"]["ts"] + phases["forward"]["dur"], abs=0.01)
        assert step["args"]["num_tokens"] == s["num_tokens"]
    mine = [e for e in track[tid[f"request {rid}"]] if e["cat"] == "request" and e["name"] in
            ("prefill", "decode", "verify")]
    want = [next(b for b in s["batch"] if b["request_id"] == rid) for s in steps]
    assert [(e["name"], e["args"]["tokens"]) for e in mine] == [(b["kind"], b["num_tokens"]) for b in want]
    assert sum(1 for e in mine if e["name"] == "prefill") >= 2  # chunked by the 6-token budget
    # batch neighbours: the other request on its own track, in exactly the steps they shared
    shared = [s["step"] for s in steps if any(b["request_id"] == other for b in s["batch"])]
    assert shared and [e["args"]["step"] for e in track[tid[f"neighbour {other}"]]] == shared
    assert all(other in e["args"]["batch_neighbours"] for e in mine if e["args"]["step"] in shared)
    # the queue: from tokenized to the start of the step that admitted it (the engine's own figure,
    # taken just after that step's scheduling, differs by at most that scheduling; 1 ms more for the
    # thread switches of a loaded machine, where 50 us failed by 13)
    fin = next(e for e in rec.events if e["type"] == "finish")
    queue = [e for e in track[tid[f"request {rid}"]] if e["name"] == "queue"]
    split = fin["ttft_split"]["queue"] * US
    if queue:
        assert abs(queue[0]["dur"] - split) <= steps[0]["schedule_seconds"] * US + 1000
    else:
        assert split <= steps[0]["schedule_seconds"] * US + 1000
    whole = next(e for e in track[tid[f"request {rid}"]] if e["name"] == f"request {rid}")
    assert whole["ts"] == 0 and whole["args"]["finish_reason"] == "length"
    tokens = [e for e in events if e["ph"] == "i" and e["tid"] == tid[f"request {rid}"]]
    assert len(tokens) == len([e for e in rec.events if e["type"] == "token"]) == 10
