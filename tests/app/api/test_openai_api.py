"""The OpenAI-compatible API, driven by the official `openai` SDK and by plain curl."""
from __future__ import annotations

import json
import re
import subprocess

import httpx
import pytest

from tests.service_utils import api_fixtures

SYSTEM = "You are a patient teacher who explains every step."


server, client = api_fixtures("tiny-moe")


def test_models(client):
    assert [m.id for m in client.models.list().data] == ["tiny-moe"]


def test_chat_completion_with_the_sdk(client, server):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there"}]
    first = client.chat.completions.create(model="tiny-moe", messages=messages, max_tokens=6, temperature=0)
    assert first.id.startswith("chatcmpl-") and first.object == "chat.completion"
    choice = first.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert first.usage.completion_tokens >= 1 and first.usage.prompt_tokens > 20
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    assert first.id in server.service.store  # the page can show (and export) this request's trace
    again = client.chat.completions.create(model="tiny-moe", messages=messages, max_tokens=6, temperature=0)
    # the repeated prompt's full 4-token blocks come from the prefix cache
    assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 4
    assert again.choices[0].message.content == choice.message.content


def test_streaming_with_the_sdk(client):
    messages = [{"role": "user", "content": "Count with me"}]
    kwargs = dict(model="tiny-moe", messages=messages, max_tokens=8, temperature=0, seed=3)
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["length"], ["stop"])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1


def test_plain_curl(server):
    body = {"model": "tiny-moe", "stream": True, "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "seed": 1,
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
    out = subprocess.run(["curl", "-sN", server.url + "v1/chat/completions", "-H", "Content-Type: application/json",
                          "-d", json.dumps(body)], capture_output=True, text=True, timeout=60, check=True).stdout
    lines = [line for line in out.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("body,status,needle", [
    ("{not json", 400, "not valid JSON"),
    ({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}, 404, "does not exist"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "top_p": 1.5}, 400, "top_p"),
    ({"messages": [{"role": "user", "content": "word " * 1000}]}, 400, "context"),
])
def test_errors_have_the_openai_shape(server, body, status, needle):
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(server.url + "v1/chat/completions", content=content,
                   headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == status
    err = r.json()["error"]
    assert needle in err["message"] and set(err) == {"message", "type", "param", "code"}
    from app.serving.engine_service import wait_idle
    assert wait_idle(server.service)
    bm = server.service.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # a refused request holds no KV block


def test_sdk_raises_on_unknown_model(client):
    import openai
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def _complete(server, text="Tell me more", max_tokens=6, **extra) -> dict:
    body = {"model": "tiny-moe", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, **extra}
    return httpx.post(server.url + "v1/chat/completions", json=body, timeout=60).json()


def _ws_url(server, query="") -> str:
    return server.url.replace("http://", "ws://") + "ws" + query


def test_websocket_carries_every_stage_of_a_request(server):
    from websockets.sync.client import connect
    from engine.trace import STAGES
    with connect(_ws_url(server)) as ws:
        done = _complete(server, trace_level="full")  # the tensors too (API requests default to "basic")
        rid, seen = done["id"], set()
        while "finish" not in seen:
            event = json.loads(ws.recv(timeout=30))
            assert event["schema"] == 1
            if event["request_id"] == rid or (event["type"] == "schedule.step" and
                                              any(b["request_id"] == rid for b in event["batch"])):
                seen.add(event["type"].split(".")[0])
    assert seen == set(STAGES) - {"spec", "trace"}  # (trace.truncated: only past a byte cap)


def test_websocket_for_one_request(server):
    from websockets.sync.client import connect
    # max_queue=None: unread events must not hold up the client's side of the close handshake (10 s)
    with connect(_ws_url(server), max_queue=None) as firehose:
        import threading
        result = {}
        worker = threading.Thread(target=lambda: result.update(_complete(server, "A long answer", 60)))
        worker.start()
        rid = json.loads(firehose.recv(timeout=30))["request_id"]
        with connect(_ws_url(server, f"?request_id={rid}"), max_queue=None) as one:
            events = []
            while not events or events[-1]["type"] != "finish":
                events.append(json.loads(one.recv(timeout=30)))
        worker.join()
    assert result["id"] == rid and len(events) > 3
    for e in events:  # its own, the batches it was in, the pool while it runs
        assert e["request_id"] == rid or any(b["request_id"] == rid for b in e.get("batch", ())) or \
            rid in e.get("request_ids", ())


def test_a_request_socket_opened_after_its_end_gets_what_the_store_holds(server):
    """/ws?request_id= of a request that ended before the socket opened: its stored events, each
    once, up to its finish (it waited for events that had all gone by: a 30 s timeout in CI)."""
    from websockets.sync.client import connect
    done = _complete(server, "Remember this", 8)
    trace = httpx.get(server.url + f"v1/traces/{done['id']}", timeout=30).json()
    with connect(_ws_url(server, f"?request_id={done['id']}"), max_queue=None) as one:
        events = []
        while not events or events[-1]["type"] != "finish":
            events.append(json.loads(one.recv(timeout=30)))
    kinds = [(e["type"], e["step"]) for e in events if e["type"] != "kv.pool"]  # (the file adds the pool before it)
    assert kinds == [(e["type"], e["step"]) for e in trace["events"] if e["type"] != "kv.pool"]
    assert events[0]["type"] == "request.arrive" and events[0]["request_id"] == done["id"]


def test_slow_reader_loses_events_not_the_engine(server):
    from app.serving.engine_service import wait_idle
    watch = server.service.subscribe_all(max_items=5)
    try:
        _complete(server, "Hello", 8)
        assert wait_idle(server.service)
        assert len(watch.drain(0.1)) == 5 and watch.dropped > 20
    finally:
        server.service.unsubscribe(watch)


def test_recorded_trace(server):
    done = _complete(server, "Remember this")
    trace = httpx.get(server.url + f"v1/traces/{done['id']}", timeout=30).json()
    assert trace["id"] == done["id"] and trace["dropped"] == 0
    types = [e["type"] for e in trace["events"]]
    assert types[0] == "request.arrive" and "finish" in types
    finish = next(e for e in trace["events"] if e["type"] == "finish")
    assert finish["usage"]["completion_tokens"] == done["usage"]["completion_tokens"]
    missing = httpx.get(server.url + "v1/traces/chatcmpl-nope", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "trace_not_found"
    # a finished trace's file is served again from its text; anything added later shows
    from app.serving.engine_service import wait_idle
    assert wait_idle(server.service)
    first = httpx.get(server.url + f"v1/traces/{done['id']}", timeout=30).text
    assert httpx.get(server.url + f"v1/traces/{done['id']}", timeout=30).text == first
    server.service.store.add(done["id"], {"type": "kv.free", "request_id": done["id"], "step": 10**6,
                                          "blocks": []})
    again = httpx.get(server.url + f"v1/traces/{done['id']}", timeout=30).json()
    assert again["events"][-1]["step"] == 10**6 and len(again["events"]) == len(json.loads(first)["events"]) + 1


def test_the_file_cache_keeps_to_its_budget():
    from app.api.events import FileCache
    cache = FileCache(max_bytes=10)
    cache.put("a", (True, 1), "aaaa")
    cache.put("b", (True, 1), "bbbb")
    assert cache.get("a", (True, 1)) == "aaaa" and cache.get("a", (True, 2)) is None  # a new version misses
    cache.put("c", (True, 1), "cccc")  # over 10 bytes: the least recently read goes
    assert cache.get("b", (True, 1)) is None and cache.get("a", (True, 1)) == "aaaa"
    cache.put("d", (True, 1), "x" * 11)  # larger than the whole budget: not kept
    assert cache.get("d", (True, 1)) is None


def test_prometheus_metrics(server):
    from app.serving.engine_service import wait_idle
    _complete(server, "Count the tokens", 5)
    assert wait_idle(server.service)
    text = httpx.get(server.url + "metrics", timeout=30).text
    # every series is labelled with its model (one server may serve several); read this one's
    # (the text format orders a series' labels by name: the model may come after `le`)
    values = {re.sub(r'\{\}|(?<=\{)model="tiny-moe",|,model="tiny-moe"(?=\})', "",
                     line.split(" ")[0].replace('{model="tiny-moe"}', "")):
              float(line.split(" ")[1]) for line in text.splitlines() if line and not line.startswith("#")}
    bm = server.service.engine.block_manager
    assert values["tokentrace_requests_running"] == 0 and values["tokentrace_requests_waiting"] == 0
    assert values["tokentrace_kv_blocks_used"] == 0
    assert values["tokentrace_kv_blocks_free"] + values["tokentrace_kv_blocks_cached"] == bm.num_blocks
    assert values["tokentrace_kv_blocks_cached"] > 0  # finished prompts stay in the prefix cache
    assert 0 < values["tokentrace_prefix_cache_hit_rate"] <= 1  # earlier tests repeated a prompt
    assert values["tokentrace_time_to_first_token_seconds_count"] >= 1
    assert values['tokentrace_time_to_first_token_seconds_bucket{le="+Inf"}'] == \
        values["tokentrace_time_to_first_token_seconds_count"]
    assert values["tokentrace_time_per_output_token_seconds_count"] >= 4
    assert "# TYPE tokentrace_requests_aborted_total counter" in text


# --- every /v1 answer in OpenAI's shape; max_tokens against the context ---------------------
def test_the_sdk_retrieves_a_model(client):
    import openai
    card = client.models.retrieve("tiny-moe")
    assert card.id == "tiny-moe" and card.object == "model"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("gpt-4")


@pytest.mark.parametrize("method,path,status,allow", [
    ("GET", "v1/nope", 404, None),
    ("POST", "v1/embeddings", 404, None),
    ("GET", "v1/chat/completions", 405, "POST"),
    ("PUT", "v1/completions", 405, "POST"),
    ("DELETE", "v1/models", 405, "GET"),
    ("POST", "v1/models", 405, "GET"),
    ("DELETE", "v1/models/tiny-moe", 405, "GET"),
    ("POST", "v1/traces/chatcmpl-x", 405, "DELETE, GET, PATCH"),
])
def test_unknown_routes_and_wrong_methods_answer_in_the_openai_shape(server, method, path, status, allow):
    r = httpx.request(method, server.url + path, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and "detail" not in r.json()
    assert err["type"] == "invalid_request_error" and f"/{path}" in err["message"]
    if allow:
        assert r.headers["allow"] == allow and f"use {allow.replace(', ', ' or ')}" in err["message"]


def test_the_sdk_raises_on_a_wrong_route(client):
    import openai
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="tiny-moe", input="x")


def _prompt_tokens(server, messages) -> int:
    return len(server.service.engine.tokenizer.encode_chat(messages))


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_max_tokens_past_the_context_is_a_400(server, client, endpoint):
    """vLLM's rule: prompt + max_tokens must fit the context (here 256 tokens)."""
    import openai
    ctx = server.service.engine.max_model_len
    messages = [{"role": "user", "content": "How long can you go on?"}]
    n = _prompt_tokens(server, messages) if endpoint == "chat" else \
        len(server.service.engine.tokenizer.encode("How long can you go on?"))
    text = {"messages": messages} if endpoint == "chat" else {"prompt": "How long can you go on?"}
    url = server.url + ("v1/chat/completions" if endpoint == "chat" else "v1/completions")
    for too_many in (100_000, ctx - n + 1):
        r = httpx.post(url, json={"model": "tiny-moe", "max_tokens": too_many, **text}, timeout=30)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "max_tokens" and err["code"] == "context_length_exceeded"
        assert f"max_tokens is too large: {too_many:,}" in err["message"]
        assert f"context length is {ctx:,} tokens and the prompt has {n:,} tokens" in err["message"]
        assert f"at most {ctx - n:,}" in err["message"]
    with pytest.raises(openai.BadRequestError, match="max_tokens is too large"):
        if endpoint == "chat":
            client.chat.completions.create(model="tiny-moe", messages=messages, max_tokens=100_000)
        else:
            client.completions.create(model="tiny-moe", prompt="How long can you go on?", max_tokens=100_000)
    # exactly the room left is fine: it runs to the end of the context
    done = httpx.post(url, json={"model": "tiny-moe", "max_tokens": ctx - n, "ignore_eos": True, "temperature": 0,
                                 **text}, timeout=120).json()
    assert done["usage"]["prompt_tokens"] == n and done["usage"]["completion_tokens"] == ctx - n
    from app.serving.engine_service import wait_idle
    assert wait_idle(server.service)
    bm = server.service.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # nothing held (cached prefixes count as free)


def test_a_body_without_max_tokens_gets_a_default_that_fits(server):
    ctx = server.service.engine.max_model_len
    tok = server.service.engine.tokenizer
    words = 1
    while len(tok.encode_chat([{"role": "user", "content": "fox " * (words + 1)}])) < ctx - 20:
        words += 1
    messages = [{"role": "user", "content": "fox " * words}]
    n = _prompt_tokens(server, messages)
    assert ctx - 64 < n < ctx  # the default of 64 would not fit
    r = httpx.post(server.url + "v1/chat/completions", timeout=120,
                   json={"model": "tiny-moe", "messages": messages, "ignore_eos": True, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == ctx - n


def test_api_requests_are_traced_at_basic_unless_they_ask(server, client):
    """--api-trace-level (default basic: every stage and token, no tensors); a body's own
    trace_level wins, through the SDK's extra_body too."""
    assert server.models.limits.api_trace_level == "basic"
    tensors = {"attention", "embed", "moe"}
    plain = _complete(server, "What is kept?")
    types = {e["type"] for e in server.service.store.get(plain["id"])}
    assert "token" in types and "sample" in types and "finish" in types and not types & tensors
    trace = httpx.get(server.url + f"v1/traces/{plain['id']}", timeout=30).json()
    assert trace["body"]["trace_level"] == "basic" and trace["truncated"] is None
    full = client.chat.completions.create(model="tiny-moe", messages=[{"role": "user", "content": "And now?"}],
                                          max_tokens=4, extra_body={"trace_level": "full"})
    assert tensors <= {e["type"] for e in server.service.store.get(full.id)}
    off = _complete(server, "Nothing?", trace_level="off")
    assert not {e["type"] for e in server.service.store.get(off["id"])} - {"schedule.step"}
