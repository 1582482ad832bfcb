"""Log-probabilities through the API with the `openai` SDK (chat and completions, streaming
and not, echo), checked against transformers' logits on the same tokens; the body's other
new fields (max_completion_tokens, user/metadata/store) and the refusal of unknown ones."""
from __future__ import annotations

import json

import httpx
import pytest
import torch

from tests.service_utils import api_fixtures
from tests.tiny import load_reference

NAME = "tiny-moe"
USER = [{"role": "user", "content": "Tell me about tokens"}]


server, client = api_fixtures(NAME)


@pytest.fixture(scope="module")
def reference(checkpoint):
    return load_reference(checkpoint("mixtral"))


def ids_of(server, rid: str) -> tuple[list[int], list[int]]:
    """(prompt ids, generated ids) as the request's trace recorded them."""
    events = server.service.store.get(rid)
    prompt = [t["id"] for t in next(e for e in events if e["type"] == "tokenize")["tokens"]]
    return prompt, [e["token_id"] for e in events if e["type"] == "token"]


def log_softmax(reference, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(reference(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_chat_logprobs_match_transformers(server, client, reference):
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=5, temperature=0.8, seed=4,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    prompt, out = ids_of(server, r.id)
    assert len(content) == len(out) == r.usage.completion_tokens
    lsm = log_softmax(reference, prompt + out)
    piece = server.service.engine.tokenizer.token_text
    for i, (entry, tid) in enumerate(zip(content, out)):
        row = lsm[len(prompt) - 1 + i]
        assert bytes(entry.bytes).decode("utf-8", "replace") == piece(tid)
        # a token that ends inside a UTF-8 character: named by its bytes (vLLM's form)
        assert entry.token == (piece(tid) if "\ufffd" not in piece(tid) else
                               "bytes:" + "".join(f"\\x{b:02x}" for b in entry.bytes))
        assert abs(entry.logprob - float(row[tid])) < 1e-3
        top = torch.topk(row, 3)
        assert [bytes(t.bytes).decode("utf-8", "replace") for t in entry.top_logprobs] == \
            [piece(t) for t in top.indices.tolist()]
        assert all(abs(t.logprob - v) < 1e-3 for t, v in zip(entry.top_logprobs, top.values.tolist()))
    assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace") == r.choices[0].message.content


def test_streamed_chat_logprobs_are_the_same(client):
    kwargs = dict(model=NAME, messages=USER, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 5)) for e in streamed] == [(e.token, round(e.logprob, 5)) for e in whole]
    assert [len(e.top_logprobs) for e in streamed] == [2] * len(whole)


def test_no_logprobs_unless_asked(client):
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=2, temperature=0)
    assert r.choices[0].logprobs is None
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=2, temperature=0, logprobs=True)
    assert all(e.top_logprobs == [] for e in r.choices[0].logprobs.content)  # top_logprobs absent: 0


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_completions_echo_scores_the_prompt(server, client, reference, max_tokens):
    """The evaluation harnesses' form: the prompt's tokens with their logprobs (the first null)."""
    prompt = "The capital of France is Paris"
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=max_tokens, echo=True, logprobs=2,
                                  temperature=0)
    choice = r.choices[0]
    ids, out = ids_of(server, r.id)
    lp = choice.logprobs
    assert choice.text.startswith(prompt) and (choice.text == prompt) == (max_tokens == 0)
    assert len(lp.tokens) == len(ids) + max_tokens and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    lsm = log_softmax(reference, ids + out[:max_tokens])
    for i in range(1, len(lp.tokens)):
        tid = (ids + out)[i]
        assert abs(lp.token_logprobs[i] - float(lsm[i - 1, tid])) < 1e-3
        assert len(lp.top_logprobs[i]) <= 2
    assert lp.text_offset[0] == 0 and all(b - a == len(t) for a, b, t in zip(lp.text_offset, lp.text_offset[1:],
                                                                           lp.tokens))
    assert r.usage.completion_tokens == max_tokens
    assert choice.finish_reason == "length" or max_tokens == 1


def test_streamed_echo_of_the_prompt_alone(client):
    kwargs = dict(model=NAME, prompt="Two plus two", max_tokens=0, echo=True, logprobs=0, temperature=0)
    whole = client.completions.create(**kwargs).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **kwargs) if c.choices]
    assert "".join(c.text for c in chunks) == whole.text == "Two plus two"
    assert [t for c in chunks if c.logprobs for t in c.logprobs.tokens] == whole.logprobs.tokens
    assert [c.finish_reason for c in chunks if c.finish_reason] == ["length"] == [whole.finish_reason]


def test_streamed_completion_logprobs(client):
    kwargs = dict(model=NAME, prompt="Once upon a time", max_tokens=5, temperature=0, logprobs=1)
    whole = client.completions.create(**kwargs).choices[0].logprobs
    chunks = [c for c in client.completions.create(stream=True, **kwargs) if c.choices and c.choices[0].logprobs]
    assert [t for c in chunks for t in c.choices[0].logprobs.tokens] == whole.tokens
    assert [o for c in chunks for o in c.choices[0].logprobs.text_offset] == whole.text_offset
    assert [round(v, 5) for c in chunks for v in c.choices[0].logprobs.token_logprobs] == \
        [round(v, 5) for v in whole.token_logprobs]


def test_max_completion_tokens_and_the_accepted_unused_fields(client):
    r = client.chat.completions.create(model=NAME, messages=USER, max_completion_tokens=3, temperature=0,
                                       user="learner-7", metadata={"lesson": "1"}, store=False,
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("fields,param,words", [
    ({"frobnicate": 1}, "frobnicate", "unrecognized request argument"),
    ({"tools": []}, "tools", "--ignore-unknown-fields"),
    ({"echo": True}, "echo", "unrecognized"),  # a completions field, not chat's
    ({"logprobs": "yes"}, "logprobs", "true or false"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
    ({"logprobs": True, "top_logprobs": 1.5}, "top_logprobs", "integer"),
    ({"top_logprobs": 2}, "top_logprobs", "needs logprobs"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", "max_completion_tokens"),
    ({"max_completion_tokens": 3, "max_tokens": 4}, "max_completion_tokens", "disagree"),
    ({"user": 5}, "user", "string"),
    ({"metadata": {"a": 1}}, "metadata", "metadata"),
    ({"store": "no"}, "store", "true or false"),
    ({"min_p": 1.5}, "min_p", "min_p"),
])
def test_chat_field_refusals_name_the_field(server, fields, param, words):
    r = httpx.post(server.url + "v1/chat/completions", json={"model": NAME, "messages": USER, **fields}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
    if param in ("frobnicate", "tools", "echo"):
        assert err["code"] == "unknown_parameter"


@pytest.mark.parametrize("fields,param", [({"logprobs": True}, "logprobs"), ({"logprobs": 21}, "logprobs"),
                                          ({"echo": 1}, "echo"), ({"top_logprobs": 1}, "top_logprobs"),
                                          ({"suffix": "x"}, "suffix"), ({"max_tokens": 0}, "max_tokens")])
def test_completion_field_refusals_name_the_field(server, fields, param):
    r = httpx.post(server.url + "v1/completions", json={"model": NAME, "prompt": "Hi", **fields}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_the_server_flag_drops_unknown_fields(checkpoint):
    from app.__main__ import parse_args, serve_limits
    from app.serving.requests import parse_body
    limits = serve_limits(parse_args(["--ignore-unknown-fields"]))
    assert limits.ignore_unknown_fields and not serve_limits(parse_args([])).ignore_unknown_fields
    body = {"messages": USER, "tools": [], "frobnicate": 1, "max_tokens": 2}
    sub = parse_body(body, endpoint="chat", ignore_unknown=limits.ignore_unknown_fields)
    assert sub.params.max_tokens == 2 and sub.body == {"messages": USER, "max_tokens": 2}  # what was read
    assert parse_body(sub.body, endpoint="chat").params.max_tokens == 2  # a replay parses it again
    assert any("tools, frobnicate" in text for _, ok, text in sub.checks if ok)
    assert json.dumps(sub.body)
