"""Structured outputs (response_format, vLLM's guided_* extras) through xgrammar's mask: on a
tiny random model, whose every answer the grammar alone makes valid, and on SmolLM2 with the
`openai` SDK's parse() and LangChain's ChatOpenAI (slow: a real model)."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from pydantic import BaseModel

from tests.service_utils import api_fixtures, served

NAME = "tiny-moe"
USER = [{"role": "user", "content": "Tell me about a person"}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "likes": {"enum": ["tea", "coffee"]}},
          "required": ["name", "age", "likes"], "additionalProperties": False}


server, client = api_fixtures(NAME)


def samples_of(server, rid):
    return [e for e in server.service.store.get(rid) if e["type"] == "sample"]


@pytest.mark.parametrize("seed", range(6))
def test_every_answer_that_stops_matches_the_schema(client, seed):
    r = client.chat.completions.create(
        model=NAME, messages=USER, max_tokens=60, temperature=1.5, seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    choice = r.choices[0]
    if choice.finish_reason == "stop":
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    else:  # cut by max_tokens: a prefix of a valid answer
        assert choice.finish_reason == "length" and choice.message.content.startswith("{")


def test_json_object_mode_and_the_grammar_stage_in_the_trace(server, client):
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=12, temperature=0,
                                       response_format={"type": "json_object"})
    assert r.choices[0].message.content.lstrip().startswith("{")
    vocab = server.service.engine.model_config.vocab_size
    evs = samples_of(server, r.id)
    assert evs and all(list(ev["stages"])[:2] == ["logits", "grammar"] for ev in evs)
    first = evs[0]["stages"]["grammar"]
    assert 0 < first["kept"] < vocab and first["moved"] == vocab - first["kept"]  # allowed / removed
    removed = [t for t, d in first["changes"]]
    assert removed and all(d is None for _, d in first["changes"]) and set(removed) <= set(evs[0]["candidates"])
    assert all(first["probs"][evs[0]["candidates"].index(t)] == 0 for t in removed)
    assert evs[0]["params"]["structured"] == "json_object"


def test_guided_choice_and_regex(client):
    for seed in range(3):
        r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=10, temperature=1.0, seed=seed,
                                           extra_body={"guided_choice": ["yes", "no", "maybe"]})
        assert r.choices[0].message.content in ("yes", "no", "maybe") and r.choices[0].finish_reason == "stop"
    r = client.completions.create(model=NAME, prompt="Pick", max_tokens=10, temperature=1.0, seed=1,
                                  extra_body={"guided_regex": "[0-9]{3}"})
    assert r.choices[0].text.isdigit() and len(r.choices[0].text) == 3 and r.choices[0].finish_reason == "stop"


def test_n_choices_each_follow_the_grammar(client):
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=40, temperature=1.2, seed=2, n=3,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "p", "schema": PERSON}})
    for c in r.choices:
        if c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.message.content), PERSON)


@pytest.mark.parametrize("fields,param", [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": []}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format"),  # does not compile (the engine's check)
    ({"guided_regex": "("}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": "not json"}, "guided_json"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
])
def test_bad_constraints_are_refused_naming_the_field(server, fields, param):
    r = httpx.post(server.url + "v1/chat/completions", json={"model": NAME, "messages": USER, **fields}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


# --- SmolLM2 with real clients -------------------------------------------------------------
class City(BaseModel):
    city: str


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from app.__main__ import build_service, parse_args
    from tests.real_models import cached_gguf
    svc = build_service(parse_args(["--model", str(cached_gguf("smollm2")), "--served-model-name", "smollm2"]))
    with served(svc, tmp_path_factory) as srv:
        yield srv


QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]


@pytest.mark.slow
def test_the_sdk_parses_a_pydantic_model(smollm2):
    from openai import OpenAI
    client = OpenAI(base_url=smollm2.url + "v1", api_key="unused", max_retries=0)
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    r = parse(model="smollm2", messages=QUESTION, response_format=City, temperature=0, max_tokens=40)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.parsed.city == "Paris"


@pytest.mark.slow
def test_langchain_chat_openai(smollm2):
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(base_url=smollm2.url + "v1", api_key="unused", model="smollm2", temperature=0, max_tokens=24,
                     max_retries=0)
    said = llm.invoke("Say hello in one word.")
    assert said.content and said.usage_metadata["output_tokens"] >= 1
    streamed = "".join(chunk.content for chunk in llm.stream("Say hello in one word."))
    assert streamed == said.content
    structured = llm.with_structured_output(City, method="json_schema")
    assert structured.invoke(QUESTION[0]["content"]).city == "Paris"
