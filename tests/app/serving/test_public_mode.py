"""Public mode (--share, or a host other than loopback): an access token on the API, a login
on the page, per-client caps on requests in flight and on max_tokens, a model fixed at
start-up, and errors that show neither file paths nor stack traces."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from app.serving.limits import PUBLIC_MAX_CONCURRENT, PUBLIC_MAX_TOKENS, ServeLimits
from tests.service_utils import app_service, served

KEY = "s3cret-token"
AUTH = {"Authorization": f"Bearer {KEY}"}
pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    # --host 0.0.0.0 makes it public; the test still listens on loopback only. Paced: a long
    # request stays in flight while the test sends others.
    svc = app_service(checkpoint, "--block-size", "4", "--host", "0.0.0.0", "--api-key", KEY, "--auth", "teacher:chalk",
                      "--max-concurrent-per-client", "1", pace_s=0.01)
    with served(svc, tmp_path_factory) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        yield c


def chat(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3, "temperature": 0, **fields}


def test_public_mode_and_its_defaults():
    local = ServeLimits.for_server("127.0.0.1", exposed=False)
    assert not local.public and local.max_tokens_cap is None and local.max_concurrent_per_client is None
    for host, exposed in (("0.0.0.0", False), ("192.168.1.5", False), ("demo.example.org", False),
                          ("127.0.0.1", True)):  # True: --share, or --public behind a proxy
        limits = ServeLimits.for_server(host, exposed)
        assert limits.public and limits.max_tokens_cap == PUBLIC_MAX_TOKENS
        assert limits.max_concurrent_per_client == PUBLIC_MAX_CONCURRENT
    assert not ServeLimits.for_server("::1", False).public and not ServeLimits.for_server("localhost", False).public
    assert ServeLimits.for_server("0.0.0.0", False, max_tokens_cap=32).max_tokens_cap == 32
    from app.__main__ import parse_args, serve_limits
    assert serve_limits(parse_args(["--public"])).public and not serve_limits(parse_args([])).public
    with pytest.raises(ValueError, match="USER:PASSWORD"):
        serve_limits(parse_args(["--auth", "nopassword"]))


def test_the_api_needs_the_token(server):
    url = server.url
    for method, path in (("GET", "v1/models"), ("POST", "v1/chat/completions"), ("GET", "metrics"),
                         ("GET", "v1/traces/x")):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = httpx.request(method, url + path, headers=headers, json=chat(), timeout=30)
            assert r.status_code == 401, (path, headers)
            assert r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(url + "healthz", timeout=30).status_code == 200  # load balancers need no token
    assert httpx.get(url + "v1/models", headers=AUTH, timeout=30).status_code == 200
    assert httpx.get(url + "metrics", headers=AUTH, timeout=30).status_code == 200


def test_the_openai_sdk_with_and_without_the_key(server):
    import openai
    good = openai.OpenAI(base_url=server.url + "v1", api_key=KEY, max_retries=0)
    reply = good.chat.completions.create(model=server.service.model_name, **chat())
    assert reply.usage.completion_tokens >= 1
    bad = openai.OpenAI(base_url=server.url + "v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_the_websocket_needs_the_token(server):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect
    ws_url = server.url.replace("http://", "ws://") + "ws"
    with pytest.raises(InvalidStatus):
        connect(ws_url).close()
    with pytest.raises(InvalidStatus):
        connect(ws_url + "?api_key=wrong").close()
    with connect(ws_url + f"?api_key={KEY}", max_queue=None) as ws:  # a browser's way
        ws.send(json.dumps(chat()))
        assert json.loads(ws.recv(timeout=30))["type"] in ("request.submitted", "request.arrive")
    with connect(ws_url, additional_headers=AUTH, max_queue=None):  # a program's way
        pass


def test_the_page_needs_a_login(server):
    from gradio_client import Client
    assert httpx.get(server.url + "config", timeout=30).status_code == 401
    for user, password, ok in (("teacher", "chalk", True), ("teacher", "wrong", False), ("anyone", KEY, True),
                               ("anyone", "chalk", False)):
        with httpx.Client(base_url=server.url, timeout=30) as browser:
            assert (browser.post("login", data={"username": user, "password": password}).status_code == 200) == ok
            assert (browser.get("config").status_code == 200) == ok
    client = Client(server.url, auth=("teacher", "chalk"), verbose=False)
    assert "/send" in client.view_api(print_info=False, return_format="dict")["named_endpoints"]


def test_max_tokens_is_capped(http):
    r = http.post("v1/chat/completions", json=chat(max_tokens=PUBLIC_MAX_TOKENS + 1))
    assert r.status_code == 400 and f"cap of {PUBLIC_MAX_TOKENS}" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "max_tokens"


def test_one_request_in_flight_per_client(server, http):
    from app.serving.engine_service import wait_idle
    long = chat(max_tokens=200, ignore_eos=True, stream=True)
    other = {"X-Forwarded-For": "203.0.113.9"}  # another client behind this machine's proxy
    with httpx.stream("POST", server.url + "v1/chat/completions", json=long, headers=AUTH, timeout=60) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert server.service.slots.in_flight("127.0.0.1") == 1
        busy = http.post("v1/chat/completions", json=chat())
        assert busy.status_code == 429
        err = busy.json()["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "rate_limit_exceeded"
        assert http.post("v1/chat/completions", json=chat(), headers=other).status_code == 200
    # the stream closed mid-way: its request is aborted and its slot given back
    assert wait_idle(server.service)
    deadline = time.monotonic() + 30
    while server.service.slots.in_flight("127.0.0.1") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.service.slots._count == {}
    assert http.post("v1/chat/completions", json=chat()).status_code == 200


def test_the_page_counts_against_the_same_cap(server):
    from gradio_client import Client
    client = Client(server.url, auth=("teacher", "chalk"), verbose=False)
    server.service.slots.acquire("127.0.0.1", "held-by-another-tab")
    try:
        out = client.predict("", "Hello", 0.0, 0, 1.0, 3, 1, False, 1, "basic", 0, 0, api_name="/send")
        assert "rejected: too many requests in flight" in out[11]
        assert "too many requests in flight" in out[15]  # shown under the Send button
    finally:
        server.service.slots.release("held-by-another-tab")
    from gradio_client.exceptions import AppError
    limit = min(PUBLIC_MAX_TOKENS, server.service.engine.max_model_len - 1)  # the cap, or the context left
    with pytest.raises(AppError, match=f"maximum value {limit}"):  # the slider stops at the API's limit
        client.predict("", "Hello", 0.0, 0, 1.0, PUBLIC_MAX_TOKENS + 1, 1, False, 1, "basic", 0, 0,
                       api_name="/send")
    out = client.predict("", "Hello", 0.0, 0, 1.0, 3, 1, False, 1, "basic", 0, 0, api_name="/send")
    assert "finished" in out[11]


def test_the_model_is_fixed_at_start_up(server, http, checkpoint):
    engine = server.service.engine
    before = engine.model_path
    for model in (str(checkpoint("llama")), "Qwen/Qwen3-0.6B", "../../etc", "hf://x/y"):
        r = http.post("v1/chat/completions", json=chat(model=model))
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert str(checkpoint("llama")) not in r.text
    assert engine.model_path == before
    assert [m["id"] for m in http.get("v1/models").json()["data"]] == [server.service.model_name]


def test_errors_show_no_paths_or_stack_traces(server, http, monkeypatch):
    service = server.service
    secret = str(service.engine.model_path / "model.safetensors")
    # an unexpected exception in a handler: a 500 in OpenAI's shape, nothing more
    def broken_submit(*args, **kwargs):
        raise RuntimeError(f"cannot map {secret}")
    monkeypatch.setattr(service, "submit", broken_submit)
    r = http.post("v1/chat/completions", json=chat())
    assert r.status_code == 500 and r.json()["error"] == {"message": "internal server error", "type": "server_error",
                                                          "param": None, "code": None}
    monkeypatch.undo()
    # a failing engine step: the live request ends with an error, /healthz says degraded
    step = service.engine.step

    def failing_step():
        service.engine.step = step  # fail once
        raise RuntimeError(f"kernel crashed reading {secret}\nTraceback (most recent call last): ...")
    service.engine.step = failing_step
    try:
        text = http.post("v1/chat/completions", json=chat(stream=True)).text
        assert "engine step failed" in text
        health = http.get("healthz").json()
        assert health["status"] == "degraded"
        for shown in (text, json.dumps(health)):
            assert secret not in shown and str(service.engine.model_path) not in shown and "Traceback" not in shown
    finally:
        service.engine.step, service.error = step, None
    # the engine's own refusals carry no paths either
    r = http.post("v1/chat/completions", json=chat(messages=[{"role": "user", "content": "word " * 400}]))
    assert r.status_code == 400 and "/" not in r.json()["error"]["message"]
