"""The library over HTTP on a real engine and real databases: traces written as requests end,
listed newest first, pinned, deleted, replayed after a restart with no model; bad input
answered in OpenAI's error shape; PostgreSQL stopped mid-run and started again."""
from __future__ import annotations

import httpx
import pytest

from app.server import create_app
from app.serving.limits import ServeLimits
from app.serving.recording import Recording, ReplayCursor
from app.serving.trace_store import TraceStore
from app.store.opening import open_library
from benchmarks.local_server import LocalServer
from tests.service_utils import app_service, started

ASK = {"max_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module")
def service(checkpoint):
    with started(app_service(checkpoint, "--num-kv-blocks", "64", "--block-size", "4", "--draft", "none",
                             model="llama")) as svc:
        yield svc


@pytest.fixture
def server(service, db_url, tmp_path_factory, monkeypatch):
    """(client, library) of the app over the module's engine, its traces in db_url."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path_factory.mktemp("gradio")))
    library = open_library(service.store, db_url, lambda line: None)
    with LocalServer(None, app=create_app(service, library=library)) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as client:
        yield client, library
    library.close()


def _chat(client, words: str, **more) -> str:
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": words}], **ASK, **more})
    assert r.status_code == 200, r.text
    return r.json()["id"]


def test_traces_are_listed_pinned_deleted_and_replay_after_a_restart(server, service, db_url):
    client, library = server
    first = _chat(client, "Tell me about <b>cats</b> please", trace_level="full")
    second = _chat(client, "And now about dogs", n=2)
    assert library.writer.flush(20)
    page = client.get("/v1/traces", params={"limit": 1}).json()
    assert page["object"] == "list" and [t["id"] for t in page["data"]] == [second] and page["has_more"]
    rest = client.get("/v1/traces", params={"limit": 5, "after": second}).json()
    assert [t["id"] for t in rest["data"]] == [first] and not rest["has_more"]  # a choice is not a trace of its own
    assert client.get("/v1/traces", params={"after": first}).json()["data"] == []  # past the end: an empty page
    row = rest["data"][0]
    assert row["prompt"] == "Tell me about <b>cats</b> please" and row["capture_level"] == "full"
    assert row["tokens"] > 6 and row["model"] == service.model_name and not row["pinned"]
    assert [t["id"] for t in client.get("/v1/traces", params={"q": "DOGS now"}).json()["data"]] == [second]
    assert client.patch(f"/v1/traces/{first}", json={"pinned": True}).json() == \
        {"id": first, "object": "trace", "pinned": True}
    assert client.patch(f"/v1/traces/{first}", json={"pinned": "yes"}).json()["error"]["param"] == "pinned"
    assert client.get("/v1/traces", params={"q": "cats"}).json()["data"][0]["pinned"]

    library.close()  # the restart: a server with no model on the same database (python -m app --replay ID)
    after = open_library(None, db_url, lambda line: None)
    rec = after.recording(first)
    assert rec is not None and after.repo.meta(first).pinned
    with LocalServer(None, app=create_app(None, replay=rec, library=after)) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as c:
        assert [t["id"] for t in c.get("/v1/traces").json()["data"]] == [second, first]
        both = Recording.loads(c.get(f"/v1/traces/{second}").content)
        assert len(both.choices) == 1 and both.choices[0][-1]["finished"]  # its second choice, in its file
        cursor = ReplayCursor(Recording.loads(c.get(f"/v1/traces/{first}").content))
        assert cursor.last_frame >= 5 and "cats" in cursor.goto(cursor.last_frame).render("request")
        assert c.delete(f"/v1/traces/{first}").json()["deleted"]
        gone = c.get(f"/v1/traces/{first}")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "trace_not_found"
    after.close()


def test_bad_input_is_a_clear_4xx(server):
    client, library = server
    rid = _chat(client, "hello")
    assert library.writer.flush(20)
    for method, path in (("GET", "/v1/traces/nope"), ("DELETE", "/v1/traces/nope"), ("PATCH", "/v1/traces/nope")):
        r = client.request(method, path, json={"pinned": True} if method == "PATCH" else None)
        assert r.status_code == 404 and r.json()["error"]["code"] == "trace_not_found", (method, path)
    r = client.get("/v1/traces", params={"after": "nope"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "after"
    assert client.get("/v1/traces", params={"limit": 0}).status_code == 400
    r = client.post("/v1/traces", content=b'{"schema": 1, "hello": "world"}')
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_trace"
    assert "not a TokenTrace trace file" in r.json()["error"]["message"]
    text = client.get(f"/v1/traces/{rid}").text
    assert client.post("/v1/traces", content=text).status_code == 409  # already there
    assert client.delete(f"/v1/traces/{rid}").status_code == 200
    assert client.post("/v1/traces", content=text).status_code == 201  # an exported file back in
    assert client.get(f"/v1/traces/{rid}").text == text


def test_a_pinned_trace_outlives_the_memory_bound():
    store = TraceStore(max_requests=2)
    for rid in ("a", "b", "c"):
        store.set_body(rid, {"messages": []})
        store.add(rid, {"type": "finish", "step": 1})
        if rid == "a":
            assert store.pin("a")
    assert store.request_ids() == ["a", "c"]  # b, the oldest unpinned, went
    store.pin("a", False)
    store.set_body("d", {})
    assert store.request_ids() == ["c", "d"]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_postgresql_stopped_mid_run_serves_from_memory_and_writes_resume(server, db_url, postgres):
    client, library = server
    _chat(client, "before the outage")
    assert library.writer.flush(20)
    postgres.stop()
    try:
        during = _chat(client, "during the outage")  # still served
        health = client.get("/healthz").json()["database"]
        assert not health["ok"] and health["error"] and health["kind"] == "postgresql"
        listed = client.get("/v1/traces").json()
        assert during in [t["id"] for t in listed["data"]] and not listed["database"]["ok"]  # memory's list
        assert client.get(f"/v1/traces/{during}").status_code == 200
    finally:
        postgres.start()
    assert library.writer.flush(30)
    assert client.get("/healthz").json()["database"]["ok"]
    other = open_library(None, db_url, lambda line: None)  # a second server on the same database shares it
    assert [t["id"] for t in other.listed(5)[0]][:1] == [during] and other.recording(during) is not None
    other.close()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_two_servers_on_one_postgresql_share_the_library(server, db_url, checkpoint, tmp_path_factory):
    client, library = server
    other = app_service(checkpoint, "--draft", "none", "--served-model-name", "second", model="llama")
    second = open_library(other.store, db_url, lambda line: None)
    with LocalServer(other, app=create_app(other, library=second)) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as c:
        here = _chat(client, "recorded on the first server")
        there = _chat(c, "recorded on the second server")
        assert library.writer.flush(20) and second.writer.flush(20)
        for each in (client, c):  # both list both, newest first, and open both
            assert [t["id"] for t in each.get("/v1/traces").json()["data"]] == [there, here]
            for rid in (here, there):
                assert Recording.loads(each.get(f"/v1/traces/{rid}").content).request_id == rid
        assert c.delete(f"/v1/traces/{here}").status_code == 200  # deleted on the second: gone from the first's list
        assert [t["id"] for t in client.get("/v1/traces").json()["data"]] == [there]
    second.close()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_public_server_without_a_key_keeps_its_library_private(server, db_url):
    client, library = server
    rid = _chat(client, "a visitor's private prompt")
    assert library.writer.flush(20)
    rec = Recording.loads(client.get(f"/v1/traces/{rid}").content)
    public = open_library(None, db_url, lambda line: None)
    with LocalServer(None, app=create_app(None, replay=rec, limits=ServeLimits(public=True), library=public)) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as c:
        for method, path in (("GET", "/v1/traces"), ("DELETE", f"/v1/traces/{rid}"), ("POST", "/v1/traces")):
            r = c.request(method, path)
            assert r.status_code == 403 and r.json()["error"]["code"] == "library_private", (method, path)
        assert c.get(f"/v1/traces/{rid}").status_code == 200  # its id still opens it
    public.close()
