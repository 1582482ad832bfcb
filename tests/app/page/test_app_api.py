"""The page's API through gradio_client: a full request, a rejected one, Stop, and the
KV calculator, against the real server (FastAPI + mounted Gradio) on a free local port."""
from __future__ import annotations

import itertools
import os
import threading
import time

import pytest

from tests.service_utils import app_service, served

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# gradio's own queue code trips pandas deprecation warnings; they are not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    with served(app_service(checkpoint, draft="mistral"), tmp_path_factory) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    from gradio_client import Client
    return Client(server.url, verbose=False)


def send(client, user, max_tokens=10, level="full", spec=True, system="Be brief."):
    # system, user, temperature, top-k, top-p, max tokens, seed, speculative, k, level, layer, head
    out = client.predict(system, user, 0.7, 0, 0.95, max_tokens, 5, spec, 3, level, 1, 3, api_name="/send")
    return out[:12]  # the panels and the status (then the export file and the replay slider)


def test_health_and_endpoints(server, client):
    import httpx
    assert httpx.get(server.url + "healthz").json()["status"] == "ok"
    assert set(client.view_api(print_info=False, return_format="dict")["named_endpoints"]) == {
        "/send", "/stop", "/kv_calculator"}


def test_a_full_request_through_the_page_api(client):
    (request, prefix, tokens, embedding, attention, kv, moe, sampling, spec, answer, timeline,
     status) = send(client, "Tell me about <img src=x onerror=alert(1)>", max_tokens=10)
    assert "finished (length), 10 tokens" in status
    rid = status.split(":")[0]
    assert "valid" in request and rid in request and "&lt;img src=x" in request
    assert "MISS" in prefix or "HIT" in prefix
    assert "generated: <b>10</b>" in tokens
    assert "d_model 64" in embedding
    assert "layer <b>1</b>" in attention and "query head <b>3</b>" in attention  # the pickers' values
    assert "pool: <b>" in kv and "KV bytes = 2 × layers" in kv
    assert "4 experts, top-2" in moe
    assert "tt-drawn" in sampling
    assert "rounds: <b>" in spec
    assert answer.count("tt-timed") == 10 and "finished: <b>length</b>" in answer
    assert "engine steps" in timeline and "TTFT" in timeline
    for html in (request, tokens, answer, sampling, spec, attention, moe):
        assert "<img src=x" not in html


def test_a_second_request_with_the_same_prefix_hits_the_cache(client):
    system = "You are a careful assistant who answers every question about foxes. " * 3
    send(client, "one", max_tokens=2, system=system, level="basic")
    prefix = send(client, "two", max_tokens=2, system=system, level="basic")[1]
    assert "HIT" in prefix and "tokens reused: <b>0</b>" not in prefix


def test_an_invalid_request_is_shown_as_rejected(client):
    out = send(client, "   ")
    assert out[-1].startswith("rejected") and "rejected" in out[0] and "empty" in out[0]


@pytest.fixture
def held_until_stop(server, monkeypatch) -> threading.Event:
    """After a few engine steps the engine waits (60 s at most) until an abort arrives: a
    request cannot finish before Stop is seen, however busy the machine. -> set by the abort."""
    engine, aborted = server.service.engine, threading.Event()
    step, abort, steps = engine.step, engine.abort, itertools.count(1)

    def held_step():
        if next(steps) > 8:
            aborted.wait(60)  # outside the engine's lock: the abort can land
        return step()

    def seen_abort(request_id: str) -> bool:
        aborted.set()
        return abort(request_id)
    monkeypatch.setattr(engine, "step", held_step)
    monkeypatch.setattr(engine, "abort", seen_abort)
    return aborted


def test_stop_aborts_the_running_request(client, held_until_stop):
    # 230 new tokens: long, and within the tiny model's 256-token context (past it is refused, as in vLLM)
    # seed 3: this model draws no end-of-text within those 230 tokens (with seed 1 it stops at 81)
    job = client.submit("", "Go on and on.", 0.7, 0, 1.0, 230, 3, False, 1, "basic", 0, 0, api_name="/send")
    end = time.monotonic() + 60
    while time.monotonic() < end:  # wait until it is streaming
        outs = job.outputs()
        if outs and "streaming" in str(outs[-1][11] if isinstance(outs[-1], (list, tuple)) else outs[-1]):
            break
        time.sleep(0.05)
    client.predict(api_name="/stop")
    final = job.result(timeout=60)
    assert "finished (abort)" in final[11] and held_until_stop.is_set()


def test_kv_calculator_endpoint(client):
    html = client.predict(2000, "float16", api_name="/kv_calculator")
    assert "262,144,000 B" in html


def test_finished_shows_before_the_recording_is_written(client):
    """Issue 13, item 12: the last tokens and "finished" reach the page before the whole trace is
    read back and written as the export file (seconds for a long answer), and the last update
    still carries every value."""
    job = client.submit("", "Tell me a long story.", 0.7, 0, 0.95, 24, 5, True, 3, "full", 0, 0, api_name="/send")
    final = job.result(timeout=120)
    outs = [o for o in job.outputs() if isinstance(o, (list, tuple))]
    def file(value) -> str | None:  # the export button's file, given as a value or in an update
        return value if isinstance(value, str) else (value or {}).get("value")

    finished = [i for i, o in enumerate(outs) if "finished" in str(o[11])]
    assert finished and not file(outs[finished[0]][12])  # first "finished": no export file yet
    assert str(file(final[12])).endswith(".json") and "finished" in final[11]  # then the recording
    assert all(isinstance(v, str) for v in final[:12])
