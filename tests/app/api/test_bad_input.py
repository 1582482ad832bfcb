"""Bad input gets a clear 4xx in OpenAI's error shape and changes nothing else: every
listed case by hand, then random bodies (hypothesis) against one live server. After each,
no request is left in the engine and the KV pool is back to its starting state."""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.service_utils import app_service, served

NAME = "tiny-moe"
CAP = 6  # --max-tokens-cap: valid fuzzed bodies finish in a few steps
BODY_LIMIT = 4096
USER = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    svc = app_service(checkpoint, "--served-model-name", NAME, "--block-size", "4", "--max-tokens-cap", str(CAP),
                      "--max-body-bytes", str(BODY_LIMIT))
    with served(svc, tmp_path_factory) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def assert_untouched(server) -> None:
    """No request left behind, every KV block free, no per-client slot held."""
    from app.serving.engine_service import wait_idle
    engine = server.service.engine
    assert wait_idle(server.service)
    with engine.lock:
        assert not [r for r, s in engine.requests.items() if not s.is_finished]
        engine.block_manager.check_invariants([])
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert server.service.slots._count == {}


def assert_error_shape(r: httpx.Response, status: int | None = None) -> dict:
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    if status is not None:
        assert r.status_code == status, r.text[:300]
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str) and err["message"]
    return err


def body(**fields) -> str:
    return json.dumps({"model": NAME, "messages": USER, **fields})


CASES = [
    # (raw body, status, words the message must hold, param)
    ("{not json", 400, "not valid JSON", None),
    ('{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400, "not valid JSON", None),
    ('{"messages": [{"role": "user", "content": "x"}], "top_p": Infinity}', 400, "not valid JSON", None),
    ("[" * 100_000 + "]" * 100_000, 413, "limit", None),
    ("[" * 2000 + "]" * 2000, 400, "JSON", None),  # deep nesting within the size limit
    ('"just a string"', 400, "JSON object", None),
    (json.dumps({"messages": USER, "max_tokens": "10" * 1000}), 400, "", None),  # a long string (under the limit)
    (json.dumps({"model": NAME, "messages": "hello"}), 400, "messages", "messages"),
    (json.dumps({"model": NAME}), 400, "messages", "messages"),
    (json.dumps({"model": NAME, "messages": []}), 400, "messages", "messages"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "   "}]}), 400, "empty", "messages"),
    (json.dumps({"model": NAME, "messages": [{"role": "wizard", "content": "x"}]}), 400, "role", "messages"),
    (json.dumps({"model": NAME, "messages": [{"role": "tool", "content": "x"}]}), 400,
     "messages[0]: role 'tool' is not one this server takes", "messages"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]}),
     400, "messages[0].content[1]: a part of type 'image_url': this server's models read text only", "messages"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": 5}]}), 400, "content", "messages"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "\ud800"}]}), 400, "lone surrogate",
     "messages"),
    (body(stop="\udfff"), 400, "stop must be valid Unicode", "stop"),
    (json.dumps({"model": NAME, "messages": [{"role": "user"}]}), 400, "content", "messages"),
    (json.dumps({"model": NAME, "messages": ["hi"]}), 400, "role", "messages"),
    (body(max_tokens=0), 400, "max_tokens", "max_tokens"),
    (body(max_tokens=-3), 400, "max_tokens", "max_tokens"),
    (body(max_tokens=CAP + 1), 400, f"cap of {CAP}", "max_tokens"),
    (body(max_tokens=2.5), 400, "integer", "max_tokens"),
    (body(max_tokens="5"), 400, "integer", "max_tokens"),
    (body(max_tokens=True), 400, "integer", "max_tokens"),
    (body(max_tokens=10 ** 12), 400, "max_tokens must be at most 2,147,483,648", "max_tokens"),
    (body(temperature=-0.1), 400, "temperature", "temperature"),
    (body(temperature=1e300), 400, "temperature", "temperature"),
    (body(temperature="hot"), 400, "temperature", "temperature"),
    (body(top_p=0), 400, "top_p", "top_p"),
    (body(top_p=1.01), 400, "top_p", "top_p"),
    (body(top_k=-2), 400, "top_k", "top_k"),
    (body(top_k=1.5), 400, "top_k", "top_k"),
    (body(seed=2 ** 64), 400, "seed", "seed"),
    (body(stop=[1, 2]), 400, "stop", "stop"),
    (body(stop={"a": 1}), 400, "stop", "stop"),
    (body(stop=[""]), 400, "stop", "stop"),
    (body(n=9), 400, "n must be in [1, 8]", "n"),
    (body(tools=[]), 400, "tools", "tools"),  # a field this server does not implement: refused, named
    (body(stream="yes"), 400, "stream", "stream"),
    (body(stream_options=[1]), 400, "stream_options", "stream_options"),
    (body(ignore_eos="no"), 400, "ignore_eos", "ignore_eos"),
    (body(speculative=7), 400, "speculative", "speculative"),
    (body(speculative={"num_tokens": 0}), 400, "speculative", "speculative"),
    (json.dumps({"model": "gpt-4", "messages": USER}), 404, "does not exist", "model"),
    (json.dumps({"model": "/etc/passwd", "messages": USER}), 404, "does not exist", "model"),
    (json.dumps({"model": "Qwen/Qwen3-0.6B", "messages": USER}), 404, "does not exist", "model"),
    (json.dumps({"model": ["a"], "messages": USER}), 404, "does not exist", "model"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "word " * 400}]}), 400, "context",
     "messages"),
]


@pytest.mark.parametrize("raw,status,words,param", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_each_bad_input_gets_a_clear_4xx(server, http, raw, status, words, param):
    r = http.post("v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    err = assert_error_shape(r, status)
    assert words in err["message"]
    if param is not None:
        assert err["param"] == param
    assert_untouched(server)


def test_a_body_over_the_limit_without_content_length(server, http):
    """A chunked upload is counted as it arrives, not trusted by its header."""
    def chunks():
        for _ in range(10):
            yield b"x" * 1000
    r = http.post("v1/chat/completions", content=chunks(), headers={"Content-Type": "application/json"})
    assert "limit" in assert_error_shape(r, 413)["message"]


def test_valid_variants_are_accepted(server, http):
    ok = [body(max_tokens=CAP, temperature=0, stop="zz"), body(max_tokens=2.0, temperature=1e-9),  # greedy
          json.dumps({"messages": [{"role": "developer", "content": "Be brief."},
                                   {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                      "max_tokens": 2, "top_k": -1, "seed": -5, "n": 1, "stream": False, "logprobs": None})]
    for raw in ok:
        r = http.post("v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
    assert_untouched(server)


def test_the_websocket_refuses_bad_bodies_the_same_way(server):
    from websockets.sync.client import connect
    with connect(server.url.replace("http://", "ws://") + "ws") as ws:
        for raw, code in (("{oops", None), (body(max_tokens=0), None), (body(model="/etc"), "model_not_found"),
                          ("x" * (BODY_LIMIT + 1), None)):
            ws.send(raw)
            while True:  # skip any trace events of other tests' requests
                msg = json.loads(ws.recv(timeout=30))
                if msg["type"] == "error":
                    break
            assert set(msg["error"]) == {"message", "type", "param", "code"} and msg["error"]["code"] == code
    assert_untouched(server)


# --- fuzzing: valid bodies, bodies with one wild field, and anything at all -------------
scalars = st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=12)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
turn = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "developer"]),
                              "content": st.text(max_size=30)})
VALID = {
    "model": st.just(NAME),
    "messages": st.lists(turn, max_size=3).map(lambda ms: ms + [{"role": "user", "content": "Hi there"}]),
    "max_tokens": st.integers(1, CAP), "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, 400), "seed": st.integers(-2 ** 63, 2 ** 64 - 1),
    "stop": st.none() | st.text(min_size=1, max_size=3) | st.lists(st.text(min_size=1, max_size=3), max_size=3),
    "stream": st.booleans(), "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "ignore_eos": st.booleans(), "n": st.just(1),
    "speculative": st.fixed_dictionaries({}, optional={"enabled": st.booleans(), "num_tokens": st.integers(1, 9)}),
    "trace_level": st.sampled_from(["full", "basic", "off"]),
}
message = st.fixed_dictionaries({}, optional={
    "role": st.sampled_from(["system", "user", "assistant", "developer", "tool", "wizard", ""]) | values,
    "content": st.text(max_size=40) | st.lists(st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=10) | values}), max_size=2)
    | values}) | values
WILD = {
    "model": st.sampled_from([NAME.upper(), "gpt-4", "/etc/passwd", "Qwen/Qwen3-0.6B", "../target", ""]) | values,
    "messages": st.lists(message, max_size=4) | values,
    "max_tokens": st.integers(-3, CAP + 3) | values, "temperature": st.floats(-1, 3) | values,
    "top_p": st.floats(-0.5, 1.5) | values, "top_k": st.integers(-3, 2 ** 40) | values,
    "seed": st.integers(-2 ** 65, 2 ** 65) | values, "stop": st.lists(st.text(max_size=3) | values, max_size=9) | values,
    "stream": values, "stream_options": st.fixed_dictionaries({"include_usage": values}) | values,
    "n": st.integers(0, 3) | values, "ignore_eos": values,
    "speculative": st.fixed_dictionaries({}, optional={"enabled": values, "num_tokens": st.integers(-1, 99) | values})
    | values,
    "trace_level": values, "logprobs": values, "tools": values,
}
valid = st.fixed_dictionaries({"model": VALID["model"], "messages": VALID["messages"]},
                              optional={k: v for k, v in VALID.items() if k not in ("model", "messages")})
one_wild = st.sampled_from(sorted(WILD)).flatmap(lambda name: st.tuples(valid, WILD[name]).map(
    lambda pair: {**pair[0], name: pair[1]}))
all_wild = st.fixed_dictionaries({}, optional=WILD)
# json.dumps writes NaN and Infinity as bare words, which strict JSON refuses
raw_bodies = (valid | one_wild | one_wild | all_wild).map(json.dumps) | st.binary(max_size=64) \
    | values.map(json.dumps)


@pytest.mark.slow  # 150 fuzzed requests
@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(raw=raw_bodies)
def test_fuzzed_bodies_never_get_a_5xx(server, http, raw):
    r = http.post("v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (raw[:300], r.text[:300])
    if r.status_code >= 400:
        assert_error_shape(r)
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]")
    else:
        assert r.json()["object"] == "chat.completion"
    assert_untouched(server)


def test_after_fuzzing_nothing_is_leaked(server, http):
    assert_untouched(server)
    assert server.service.error is None  # no engine step failed
    assert http.get("healthz").json()["status"] == "ok"
