"""POST /v1/completions with a prompt of token ids (OpenAI's `prompt: [int]` and its batch of
one, `[[int]]`), driven by the `openai` SDK and curl: the same completion as the text those
ids encode, echo gives their text back, the trace and the library show that text, and bad ids
get a 400 that names `prompt` with nothing held after."""
from __future__ import annotations

import json
import subprocess

import httpx
import pytest

from tests.service_utils import api_fixtures

TEXT = "The fox and the owl"


server, client = api_fixtures("tiny-moe")


def ids_of(server, text: str) -> list[int]:
    return server.service.engine.tokenizer.encode(text)


def test_token_ids_complete_as_the_text_they_encode(server, client):
    ids = ids_of(server, TEXT)
    kwargs = {"model": "tiny-moe", "max_tokens": 8, "temperature": 0}
    as_text = client.completions.create(prompt=TEXT, **kwargs)
    for prompt in (ids, [ids]):
        got = client.completions.create(prompt=prompt, **kwargs)
        assert got.choices[0].text == as_text.choices[0].text
        assert got.usage.prompt_tokens == len(ids) == as_text.usage.prompt_tokens


def test_echo_gives_the_ids_text_back_with_their_logprobs(server, client):
    ids = ids_of(server, TEXT)
    text = server.service.engine.tokenizer.decode(ids, skip_special_tokens=False)
    scored = client.completions.create(model="tiny-moe", prompt=ids, echo=True, max_tokens=0, logprobs=1)
    assert scored.choices[0].text == text
    lp = scored.choices[0].logprobs
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None and all(
        x is not None and x <= 0 for x in lp.token_logprobs[1:])
    chunks = list(client.completions.create(model="tiny-moe", prompt=ids, echo=True, max_tokens=3, temperature=0,
                                            stream=True))
    assert chunks[0].choices[0].text == text
    whole = client.completions.create(model="tiny-moe", prompt=ids, echo=True, max_tokens=3, temperature=0)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text


def test_plain_curl_and_the_trace_show_the_ids_text(server):
    ids = ids_of(server, TEXT)
    out = subprocess.run(["curl", "-s", server.url + "v1/completions", "-H", "Content-Type: application/json",
                          "-d", json.dumps({"model": "tiny-moe", "prompt": ids, "max_tokens": 4, "temperature": 0,
                                            "trace_level": "basic"})],
                         capture_output=True, text=True, timeout=60, check=True)
    rid = json.loads(out.stdout)["id"]
    trace = httpx.get(server.url + f"v1/traces/{rid}", timeout=30).json()
    events = trace["events"]
    arrive = next(e for e in events if e["type"] == "request.arrive")
    assert arrive["prompt"] == server.service.engine.tokenizer.decode(ids, skip_special_tokens=False)
    assert next(e for e in events if e["type"] == "tokenize")["count"] == len(ids)
    from app.store.summary import prompt_words
    assert trace["body"]["prompt"] == ids
    assert prompt_words(trace["body"], events) == " ".join(arrive["prompt"].split())  # the library's line


@pytest.mark.parametrize("prompt,words", [
    ([], "list of token ids"), ([1, "a"], "list of token ids"), ([-1], "list of token ids"),
    ([1.5], "list of token ids"), ([[1], [2]], "one prompt a request"), (["a", "b"], "one prompt a request"),
    ([10 ** 6], "prompt token ids must be in [0, "),
])
def test_bad_token_prompts_get_a_400_naming_prompt(server, prompt, words):
    r = httpx.post(server.url + "v1/completions", json={"model": "tiny-moe", "prompt": prompt, "max_tokens": 2},
                   timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"] and err["param"] == "prompt"
    from app.serving.engine_service import wait_idle
    assert wait_idle(server.service)
    bm = server.service.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_the_stages_say_the_client_sent_ids_not_text(server):
    """The Request and Tokenize stages of a token-id request, drawn from its trace, in English and Chinese."""
    from visualizers.journey import journey
    ids = ids_of(server, TEXT)
    rid = httpx.post(server.url + "v1/completions", json={"model": "tiny-moe", "prompt": [ids], "max_tokens": 3,
                                                          "trace_level": "basic"}, timeout=60).json()["id"]
    trace = httpx.get(server.url + f"v1/traces/{rid}", timeout=30).json()
    model = server.service.model_info()
    for lang, sent, ran, chip in (
            ("en", f"as <b>{len(ids)}</b> token ids, not text", "neither a chat template nor the tokenizer ran",
             f"{len(ids)} token ids"),
            ("zh_CN", f"内容是 <b>{len(ids)}</b> 个词元 ID 而不是文本", "分词器都没有运行", f"{len(ids)} 个词元 ID")):
        stages = {s.key: s for s in journey(model, rid, trace["body"], trace["events"], trace["outputs"], lang=lang)}
        assert sent in stages["request"].text and ran in stages["tokens"].text, lang
        assert stages["request"].chip == chip  # the map's chip: ids, not characters (none were sent)
    import visualizers as viz
    tokenize = next(e for e in trace["events"] if e["type"] == "tokenize")
    sent = viz.id_prompt(trace["body"])
    assert sent == ids
    panel = viz.tokens_html(tokenize, ids_sent=sent is not None)  # the Tokens panel's time: no tokenizing was done
    assert "ids read in" in panel and "tokenized in" not in panel


def test_the_websocket_names_the_prompt_of_a_refused_completion(server):
    from websockets.sync.client import connect
    with connect(server.url.replace("http://", "ws://") + "ws") as ws:
        ws.send(json.dumps({"model": "tiny-moe", "prompt": [10 ** 6], "max_tokens": 2}))
        while (msg := json.loads(ws.recv(timeout=30)))["type"] != "error":
            pass  # (another test's trace events)
    assert msg["error"]["param"] == "prompt" and "prompt token ids must be in" in msg["error"]["message"]
