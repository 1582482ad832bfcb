"""Several models on one server: `--model A --draft DA --model B --draft ngram ...`, each on
its own engine; the API picks one by `model`, the OpenAI SDK lists and retrieves them, /ws,
traces and /metrics cover every engine, and public mode still serves only the start-up set.
A base model (no chat template) answers plain prompts on /v1/completions."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from app.__main__ import ModelSpec, build_services, parse_args
from engine.kernels.cpu import blocked_bytes
from tests.paths import ROOT
from tests.service_utils import served

ASSETS = ROOT / "assets" / "models"
TARGET, DRAFT = str(ASSETS / "target"), str(ASSETS / "draft")
KEY = "multi-key"
pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")
HELLO = [{"role": "user", "content": "Tell me a fortune."}]


def base_model(src: Path, dst: Path) -> Path:
    """A copy of a tiny checkpoint whose tokenizer has no chat template (a base model)."""
    shutil.copytree(src, dst)
    (dst / "chat_template.jinja").unlink(missing_ok=True)
    cfg_file = dst / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.pop("chat_template", None)
    cfg_file.write_text(json.dumps(cfg))
    return dst


def test_each_draft_and_name_belongs_to_the_model_before_it():
    args = parse_args(["--model", "A", "--draft", "DA", "--served-model-name", "a", "--model", "B", "--draft",
                       "ngram", "--model", "C", "--port", "9"])
    assert args.models == [ModelSpec("A", "DA", "a"), ModelSpec("B", "ngram", None), ModelSpec("C", None, None)]
    assert (args.model, args.draft, args.served_model_name, args.port) == ("A", "DA", "a", 9)  # the first's view
    # before any --model: the first model's (the old order-free form keeps working)
    assert parse_args(["--draft", "D", "--model", "A"]).models == [ModelSpec("A", "D", None)]
    assert parse_args(["--draft", "none"]).models == [ModelSpec(None, "none", None)]  # the embedded model
    assert parse_args([]).models == [ModelSpec(None, None, None)]
    for twice in (["--model", "A", "--draft", "x", "--draft", "y"], ["--draft", "x", "--model", "A", "--draft", "y"],
                  ["--model", "A", "--served-model-name", "a", "--served-model-name", "b"]):
        with pytest.raises(SystemExit):
            parse_args(twice)


def test_default_drafts_and_served_names(tmp_path):
    from app.__main__ import default_draft, draft_label, served_name

    class Engine:
        model_path = Path("/somewhere/target")
    assert default_draft(ModelSpec(None)) == DRAFT  # the embedded model keeps its embedded draft
    assert default_draft(ModelSpec(TARGET)) is None and default_draft(ModelSpec(None, "None")) is None
    assert default_draft(ModelSpec("m", "NGRAM")) == "ngram" and default_draft(ModelSpec("m", "d/")) == "d/"
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"")
    assert served_name(ModelSpec(None), Engine) == "target"
    assert served_name(ModelSpec(str(gguf)), Engine) == "SmolLM2-135M-Instruct.Q4_1"  # a file: its stem
    assert served_name(ModelSpec(str(tmp_path) + "/"), Engine) == tmp_path.name  # a directory: its name
    assert served_name(ModelSpec("smollm2"), Engine) == "smollm2"  # a catalog name or hub id: as given
    assert served_name(ModelSpec("Qwen/Qwen3-0.6B"), Engine) == "Qwen/Qwen3-0.6B"
    assert served_name(ModelSpec(TARGET, served_model_name="mine"), Engine) == "mine"
    assert draft_label("ngram") == "ngram" and draft_label(DRAFT) == "draft" and draft_label(None) is None


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    """The embedded target (no draft), the embedded draft as a model of its own (n-gram
    drafts), and a tiny base model with no chat template."""
    base = base_model(checkpoint("llama"), tmp_path_factory.mktemp("base") / "tiny-base")
    lines: list[str] = []
    models = build_services(parse_args(["--model", TARGET, "--draft", "none", "--model", DRAFT, "--draft", "ngram",
                                        "--model", str(base), "--num-kv-blocks", "64"]), say=lines.append)
    models.lines = lines
    with served(models, tmp_path_factory) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI
    return OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0)


def test_start_up_loads_each_model_and_says_its_memory(server):
    models = server.models
    assert models.names == ["target", "draft", "tiny-base"] and server.service is models.first
    lines = models.lines
    assert [line for line in lines if line.startswith("[")] == [
        f"[1/3] loading {TARGET}", f"[2/3] loading {DRAFT} (draft: ngram)",
        f"[3/3] loading {models.services[2].engine.model_path}"]
    for s in models:
        e = s.engine
        line = next(line for line in lines if line.strip().startswith(f"{s.model_name}: weights "))
        assert f"({e.block_manager.num_blocks * e.config.block_size:,} tokens)" in line
        assert s.model_info()["weights_bytes"] == sum(p.numel() * p.element_size() for p in e.runner.model.parameters()) + \
            sum(b.numel() * b.element_size() for b in e.runner.model.buffers()) + blocked_bytes(e.runner.model)  # the C kernels' blocked weights: their only copy
    assert "n-gram drafts" in next(line for line in lines if line.strip().startswith("draft: "))
    # each model runs on its own engine (own thread, own KV pool)
    engines = [s.engine for s in models]
    assert len({id(e) for e in engines}) == 3 and len({id(e.runner.kv_cache) for e in engines}) == 3
    assert len({id(s._thread) for s in models}) == 3
    infos = [s.model_info() for s in models]
    assert [i["draft"] for i in infos] == [None, "ngram", None]
    assert [i["chat_template"] for i in infos] == [True, True, False]
    assert infos[0]["is_moe"] and not infos[1]["is_moe"] and infos[0]["architecture"] == "MixtralForCausalLM"


def test_models_list_and_retrieve_with_the_sdk(client, server):
    import openai
    assert [m.id for m in client.models.list().data] == ["target", "draft", "tiny-base"]
    card = client.models.retrieve("draft")
    assert card.id == "draft" and card.object == "model" and card.owned_by == "tokentrace"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    r = httpx.get(server.url + "v1/models/gpt-4", timeout=30)
    err = r.json()["error"]
    assert r.status_code == 404 and err["code"] == "model_not_found" and err["param"] == "model"
    assert err["type"] == "invalid_request_error" and "'target', 'draft', 'tiny-base'" in err["message"]


def test_model_picks_the_engine(client, server):
    from engine import LLM, SamplingParams
    for name, path in (("draft", DRAFT), ("target", TARGET)):
        reply = client.chat.completions.create(model=name, messages=HELLO, max_tokens=10, temperature=0)
        assert reply.model == name
        own = LLM(path, num_kv_blocks=64).chat(HELLO, SamplingParams(temperature=0, max_tokens=10))
        assert reply.choices[0].message.content == own.text, name  # that engine's own greedy answer
        service = server.models.owner(reply.id)
        assert service is server.models.by_name[name]
        # the trace says which model made it, in the file and in each event
        trace = httpx.get(server.url + f"v1/traces/{reply.id}", timeout=30).json()
        assert trace["model"]["name"] == name and trace["body"]["model"] == name
        assert {e["model"] for e in trace["events"]} == {name}
    # the two engines answer differently: the routing is visible in the text
    a, b = (client.chat.completions.create(model=n, messages=HELLO, max_tokens=10, temperature=0)
            for n in ("target", "draft"))
    assert a.choices[0].message.content != b.choices[0].message.content
    # no model: the first one
    r = httpx.post(server.url + "v1/chat/completions", json={"messages": HELLO, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and r.json()["model"] == "target"


def test_an_unknown_model_is_a_404_naming_the_served_ones(server):
    for model in ("gpt-4", DRAFT, "", 7):
        r = httpx.post(server.url + "v1/chat/completions", json={"model": model, "messages": HELLO}, timeout=30)
        assert r.status_code == 404, model
        err = r.json()["error"]
        assert err["code"] == "model_not_found" and err["param"] == "model"
        assert "this server serves 'target', 'draft', 'tiny-base'" in err["message"]


def test_streaming_traces_and_the_websocket_cover_every_engine(server):
    from websockets.sync.client import connect
    ws_url = server.url.replace("http://", "ws://") + "ws"
    with connect(ws_url, max_queue=None) as fire:
        ids = {}
        for name in ("target", "draft"):
            body = {"model": name, "messages": HELLO, "max_tokens": 4, "temperature": 0, "stream": True}
            with httpx.stream("POST", server.url + "v1/chat/completions", json=body, timeout=60) as r:
                chunks = [json.loads(line[6:]) for line in r.iter_lines()
                          if line.startswith("data: ") and line != "data: [DONE]"]
            assert {c["model"] for c in chunks} == {name}
            ids[chunks[0]["id"]] = name
        seen: dict[str, set] = {}
        while set(seen) != set(ids) or any(not {"finish"} <= seen[i] for i in ids):
            ev = json.loads(fire.recv(timeout=30))
            if ev.get("request_id") in ids:
                assert ev["model"] == ids[ev["request_id"]]
                seen.setdefault(ev["request_id"], set()).add(ev["type"])
    # one request watched by id, on whichever engine runs it
    with connect(ws_url, max_queue=None) as ws:
        ws.send(json.dumps({"model": "draft", "messages": HELLO, "max_tokens": 3}))
        first = json.loads(ws.recv(timeout=30))
        assert first["type"] == "request.submitted" and server.models.owner(first["request_id"]).model_name == "draft"
    metrics = httpx.get(server.url + "metrics", timeout=30).text
    for name in server.models.names:
        assert f'tokentrace_kv_blocks_used{{model="{name}"}} ' in metrics
        assert f'tokentrace_time_to_first_token_seconds_count{{model="{name}"}} ' in metrics
    assert metrics.count("# TYPE tokentrace_kv_blocks_used gauge") == 1


def test_a_base_model_answers_plain_prompts(client, server):
    import openai

    from engine import LLM, SamplingParams
    with pytest.raises(openai.BadRequestError, match="no chat template"):
        client.chat.completions.create(model="tiny-base", messages=HELLO, max_tokens=4)
    done = client.completions.create(model="tiny-base", prompt="The quick brown fox", max_tokens=6, temperature=0)
    assert done.object == "text_completion" and done.model == "tiny-base"
    own = LLM(server.models.by_name["tiny-base"].engine.model_path).generate(
        ["The quick brown fox"], SamplingParams(temperature=0, max_tokens=6))[0]
    assert done.choices[0].text == own.text and done.usage.completion_tokens == len(own.token_ids)
    streamed = list(client.completions.create(model="tiny-base", prompt="The quick brown fox", max_tokens=6,
                                              temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == own.text
    tokenize = next(e for e in server.models.by_name["tiny-base"].store.get(done.id) if e["type"] == "tokenize")
    assert tokenize["chat_template"] is False
    r = httpx.post(server.url + "v1/completions", json={"model": "tiny-base", "prompt": "  "}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_public_mode_serves_only_the_start_up_models(tmp_path_factory, checkpoint):
    models = build_services(parse_args(["--model", TARGET, "--draft", "none", "--model", DRAFT, "--host", "0.0.0.0",
                                        "--api-key", KEY, "--max-concurrent-per-client", "1",
                                        "--num-kv-blocks", "32"]), say=lambda line: None)
    assert models.limits.public
    paths = [s.engine.model_path for s in models]
    with served(models, tmp_path_factory) as srv, \
            httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
        for model in (str(checkpoint("llama")), "Qwen/Qwen3-0.6B", "../../etc", "smollm2", TARGET):
            for path in ("v1/chat/completions", "v1/completions"):
                r = http.post(path, json={"model": model, "messages": HELLO, "prompt": "x", "max_tokens": 2})
                assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", (model, path)
                assert str(checkpoint("llama")) not in r.text and str(ASSETS) not in r.text
            assert http.get(f"v1/models/{model}").status_code == 404
        assert [m["id"] for m in http.get("v1/models").json()["data"]] == ["target", "draft"]
        assert [s.engine.model_path for s in models] == paths and len(models) == 2  # nothing loaded
        assert http.post("v1/chat/completions", json={"model": "draft", "messages": HELLO,
                                                      "max_tokens": 2}).status_code == 200
        # the per-client cap counts a client's requests to every model
        models.first.slots.acquire("127.0.0.1", "held-by-a-request-to-target")
        try:
            r = http.post("v1/chat/completions", json={"model": "draft", "messages": HELLO, "max_tokens": 2})
            assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
        finally:
            models.first.slots.release("held-by-a-request-to-target")


def test_two_models_cannot_share_a_name():
    with pytest.raises(ValueError, match="same --served-model-name"):
        build_services(parse_args(["--model", TARGET, "--served-model-name", "x", "--model", DRAFT,
                                   "--served-model-name", "x"]), say=lambda line: None)
    from app.serving.served_models import ServedModels

    class Fake:
        def __init__(self, name):
            self.model_name, self.limits = name, None
    with pytest.raises(ValueError, match="two models are served as 'target'"):
        ServedModels([Fake("target"), Fake("target")])
