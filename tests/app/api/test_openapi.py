"""The HTTP edge's description of itself: /openapi.json has the schema of every POST body,
/docs loads from this server alone, and unknown fields are refused unless the
server runs with --ignore-unknown-fields."""
from __future__ import annotations

import re

import httpx
import pytest

from tests.service_utils import app_service, served

NAME = "tiny-moe"
USER = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    svc = app_service(checkpoint, "--served-model-name", NAME, "--block-size", "4", "--max-tokens-cap", "4")
    with served(svc, tmp_path_factory) as srv:
        yield srv


@pytest.fixture(scope="module")
def lenient(checkpoint, tmp_path_factory):
    svc = app_service(checkpoint, "--served-model-name", NAME, "--block-size", "4", "--max-tokens-cap", "4",
                      "--ignore-unknown-fields")
    with served(svc, tmp_path_factory) as srv:
        yield srv


def resolve(spec: dict, schema: dict) -> dict:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


MAIN = ("max_tokens", "temperature", "top_p", "seed", "n", "stop", "response_format", "stream", "stream_options",
        "logprobs", "top_k", "speculative", "trace_level", "logit_bias", "guided_json")


def test_every_post_route_has_the_schema_of_its_body(server):
    spec = httpx.get(server.url + "openapi.json", timeout=30).json()
    posts = {path: ops["post"] for path, ops in spec["paths"].items() if "post" in ops}
    assert {"/v1/chat/completions", "/v1/completions", "/classroom", "/classroom/{room_id}/goto",
            "/classroom/{room_id}/question", "/classroom/{room_id}/select", "/classroom/{room_id}/vote"} <= set(posts)
    for path, op in posts.items():
        body = resolve(spec, op["requestBody"]["content"]["application/json"]["schema"])
        assert body["type"] == "object" and body["properties"], path
    chat = resolve(spec, posts["/v1/chat/completions"]["requestBody"]["content"]["application/json"]["schema"])
    completion = resolve(spec, posts["/v1/completions"]["requestBody"]["content"]["application/json"]["schema"])
    assert set(MAIN + ("messages", "top_logprobs", "max_completion_tokens")) <= set(chat["properties"])
    assert set(MAIN + ("prompt", "echo")) <= set(completion["properties"])
    assert "messages" in chat["required"] and "prompt" in completion["required"]
    assert chat["additionalProperties"] is False  # unknown fields are refused
    # OpenAI's ranges, as the schema says them
    n = next(s for s in chat["properties"]["n"]["anyOf"] if s.get("type") == "integer")
    assert (n["minimum"], n["maximum"]) == (1, 8)
    temperature = next(s for s in chat["properties"]["temperature"]["anyOf"] if s.get("type") == "number")
    assert (temperature["minimum"], temperature["maximum"]) == (0, 2)
    message = resolve(spec, chat["properties"]["messages"]["items"])
    assert set(message["properties"]["role"]["enum"]) == {"system", "developer", "user", "assistant"}


def test_docs_load_from_this_server_alone(server):
    html = httpx.get(server.url + "docs", timeout=30).text
    hosts = set(re.findall(r"https?://([^/\"'\s]+)", html))
    assert hosts <= {server.url.split("//")[1].rstrip("/")}, hosts
    assets = re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", html)
    assert len(assets) >= 3  # Swagger UI's script, its style, the favicon; the spec
    for asset in assets:
        r = httpx.get(server.url + asset.lstrip("/"), timeout=30)
        assert r.status_code == 200 and r.content, asset
    assert '"validatorUrl": null' in html  # no call to Swagger's online validator
    assert "redoc" not in httpx.get(server.url + "redoc", timeout=30).text.lower()  # not served (it uses a CDN)


def test_unknown_fields_are_refused_and_the_flag_drops_them(server, lenient):
    # ignore_eos: a sampled draw of the tiny model may end at its first token (CI, 2026-12-06)
    body = {"model": NAME, "messages": USER, "max_tokens": 2, "ignore_eos": True, "tools": [], "frobnicate": 1}
    r = httpx.post(server.url + "v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert (err["param"], err["code"]) == ("tools", "unknown_parameter") and "--ignore-unknown-fields" in err["message"]
    r = httpx.post(lenient.url + "v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2
    r = httpx.post(lenient.url + "v1/completions", json={"model": NAME, "prompt": "Hi", "max_tokens": 2,
                                                           "suffix": "x"}, timeout=60)
    assert r.status_code == 200, r.text
    # a known field with a wrong type is still refused with the flag
    r = httpx.post(lenient.url + "v1/chat/completions", json={**body, "n": "2"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_a_bad_path_or_query_parameter_gets_the_openai_error_shape(server):
    done = httpx.post(server.url + "v1/chat/completions", json={"model": NAME, "messages": USER, "max_tokens": 2},
                      timeout=60).json()
    room = httpx.post(server.url + "classroom", json={"request_id": done["id"]}, timeout=60).json()
    r = httpx.get(server.url + f"classroom/{room['id']}/stage/abc", timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == "index"
    assert httpx.get(server.url + "classroom/nope/stage/abc", timeout=30).json()["error"]["code"] == "room_not_found"
