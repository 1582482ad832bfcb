"""Penalties, logit_bias and min_tokens through the API (the `openai` SDK's fields and vLLM's
extras), their validation, and their stages in the request's trace."""
from __future__ import annotations

import httpx
import pytest

from tests.service_utils import app_service, served

NAME = "tiny-moe"
USER = [{"role": "user", "content": "Say something"}]


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    svc = app_service(checkpoint, "--served-model-name", NAME, "--block-size", "4")
    with served(svc, tmp_path_factory) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI
    return OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0)


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
