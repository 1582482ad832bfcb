"""Penalties, logit_bias and min_tokens through the API (the `openai` SDK's fields and vLLM's
extras), their validation, and their stages in the request's trace."""
from __future__ import annotations

import httpx
import pytest

from tests.service_utils import api_fixtures

NAME = "tiny-moe"
USER = [{"role": "user", "content": "Say something"}]


server, client = api_fixtures(NAME)


def tokens_of(server, rid):
    return [e["token_id"] for e in server.service.store.get(rid) if e["type"] == "token"]


def samples_of(server, rid):
    return [e for e in server.service.store.get(rid) if e["type"] == "sample"]


def test_logit_bias_forces_a_token_and_the_trace_shows_the_move(server, client):
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=3, temperature=0.8, seed=2,
                                       logit_bias={"77": 100}, extra_body={"ignore_eos": True})
    assert tokens_of(server, r.id) == [77, 77, 77]
    for ev in samples_of(server, r.id):
        stage = ev["stages"]["logit_bias"]
        assert list(ev["stages"])[:2] == ["logits", "logit_bias"] and stage["moved"] == 1
        assert stage["changes"] == [[77, 100.0]] and 77 in ev["candidates"]
        assert ev["params"]["logit_bias"] == {"77": 100.0}


def test_min_tokens_holds_off_the_end(server, client):
    eos = server.service.engine.model_config.eos_token_ids[0]
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=8, temperature=0,
                                       logit_bias={str(eos): 100}, extra_body={"min_tokens": 3})
    assert tokens_of(server, r.id) == tokens_of(server, r.id)[:3] + [eos] and eos not in tokens_of(server, r.id)[:3]
    assert r.choices[0].finish_reason == "stop"
    stages = [list(ev["stages"]) for ev in samples_of(server, r.id)]
    assert [s[1] for s in stages] == ["min_tokens"] * 3 + ["logit_bias"]  # the mask, until 3 tokens exist


def test_penalties_are_stages_in_the_trace(server, client):
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=4, temperature=0,
                                       presence_penalty=1.0, frequency_penalty=0.5,
                                       extra_body={"repetition_penalty": 1.3})
    evs = samples_of(server, r.id)
    assert list(evs[0]["stages"]) == ["logits", "repetition_penalty"]  # nothing generated yet: no output counts
    assert list(evs[-1]["stages"]) == ["logits", "repetition_penalty", "frequency_penalty", "presence_penalty"]
    assert evs[-1]["stages"]["presence_penalty"]["moved"] == len(set(tokens_of(server, r.id)[:-1]))
    assert all(d == -1.0 for _, d in evs[-1]["stages"]["presence_penalty"]["changes"])


@pytest.mark.parametrize("fields,param", [
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": "x"}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"), ({"min_tokens": 1.5}, "min_tokens"),
    ({"logit_bias": [1]}, "logit_bias"), ({"logit_bias": {"a": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"), ({"logit_bias": {"5": True}}, "logit_bias"),
    ({"logit_bias": {"99999": 1}}, "logit_bias"),  # past the vocabulary (the engine's check)
    ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
])
def test_bad_values_are_refused_naming_the_field(server, fields, param):
    r = httpx.post(server.url + "v1/chat/completions", json={"model": NAME, "messages": USER, **fields}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_n_choices_with_the_sdk(server, client):
    kwargs = dict(model=NAME, messages=USER, max_tokens=4, temperature=1.0, seed=11, n=3, logprobs=True,
                  extra_body={"ignore_eos": True})
    r = client.chat.completions.create(**kwargs)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(len(c.logprobs.content) == 4 for c in r.choices)
    assert r.usage.completion_tokens == 12 and r.usage.total_tokens == r.usage.prompt_tokens + 12
    again = client.chat.completions.create(**kwargs)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]  # seed: the same set
    # the other choices took the prompt's full pages from the prefix cache (their traces say so): prefilled once
    lookups = [next(e for e in server.service.store.get(rid) if e["type"] == "prefix_cache.lookup")
               for rid in (r.id, f"{r.id}.1", f"{r.id}.2")]
    full = (r.usage.prompt_tokens - 1) // 4
    assert [len(e["cached_blocks"]) for e in lookups[1:]] == [full, full]
    assert lookups[1]["cached_blocks"] == lookups[2]["cached_blocks"]


def test_n_choices_stream_with_their_index(client):
    kwargs = dict(model=NAME, messages=USER, max_tokens=3, temperature=1.0, seed=5, n=2,
                  extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    text = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            text[ch.index] += ch.delta.content or ""
    assert [text[0], text[1]] == [c.message.content for c in whole.choices]
    assert sorted(ch.index for c in chunks for ch in c.choices if ch.finish_reason) == [0, 1]


def test_completions_n_with_echo(client):
    r = client.completions.create(model=NAME, prompt="Hello there", max_tokens=2, n=2, echo=True, logprobs=1,
                                  temperature=1.0, seed=3)
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        assert c.text.startswith("Hello there") and c.logprobs.token_logprobs[0] is None


@pytest.mark.parametrize("n", [0, 9, 1.5, "2"])
def test_n_out_of_range_is_refused(server, n):
    r = httpx.post(server.url + "v1/chat/completions", json={"model": NAME, "messages": USER, "n": n}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_the_websocket_sends_every_choices_outputs(server):
    import json

    from websockets.sync.client import connect
    with connect(server.url.replace("http://", "ws://") + "ws", max_queue=None) as ws:
        ws.send(json.dumps({"model": NAME, "messages": USER, "max_tokens": 3, "n": 2, "temperature": 1.0,
                            "ignore_eos": True}))
        rid, done = None, set()
        while rid is None or len(done) < 2:
            msg = json.loads(ws.recv(timeout=30))
            if msg["type"] == "request.submitted":
                rid = msg["request_id"]
            elif msg["type"] == "output" and msg["finished"]:
                done.add(msg["request_id"])
    assert done == {rid, f"{rid}.1"}
