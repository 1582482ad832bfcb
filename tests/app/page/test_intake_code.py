"""The app's part of the request stage's code (app/page/intake_code.py), beside the engine's
map: every function it names resolves in this checkout from app/ (moved, renamed or deleted
without the map following fails here), each mark on one line, each way known; the request
stage's view leads with it and says which way in this request took; GET /code/{key} serves a
stage's view, opened, and nothing else."""
from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.page.code_panel import add_code_routes, code_body, code_views, stages, with_code
from app.page.intake_code import INTAKE_CODE, PATHS, intake_way
from engine import checkout_commit, resolve
from engine.code_source import ROOT
from visualizers.journey import KEYS, Stage


@pytest.mark.parametrize("code", INTAKE_CODE, ids=[c.name for c in INTAKE_CODE])
def test_each_intake_function_is_where_the_map_says(code):
    e = resolve(code)
    assert e["file"].startswith("app/")
    lines = (ROOT / e["file"]).read_text().splitlines()
    assert e["source"] == lines[e["line"] - 1:e["end"]]
    assert e["qualname"].split(".")[-1] in "\n".join(e["source"][:4])
    for mark, at in zip(code.marks, e["marks"]):
        assert mark in lines[at - 1]
    assert not code.path or code.path in PATHS


def test_the_request_stage_leads_with_the_apps_intake():
    names = [e["name"] for e in stages()["request"]]
    assert names[:len(INTAKE_CODE)] == [c.name for c in INTAKE_CODE]
    assert names[len(INTAKE_CODE)] == "engine.llm_engine:LLMEngine.add_request"
    assert not [e for e in stages()["request"] if "error" in e]
    assert "model_validate(body)" in code_body("request")


def test_the_way_in_this_request_took():
    assert intake_way("chatcmpl-0123") == "http" and intake_way("cmpl-9") == "http"
    assert intake_way("req-3-ab12") == "page" and intake_way("") == ""
    shown = [Stage(k, k, "", ()) for k in KEYS]
    said = {s.key: s.text for s in with_code(shown, {"commit": checkout_commit()}, [], "chatcmpl-1")}
    assert "Ran for this request:</b> an HTTP request" in said["request"]
    assert "data-path='http'] .tt-way-ran" in said["request"] and "data-path='page'] .tt-way-not" in said["request"]


def test_the_route_serves_a_stages_view_opened():
    api = FastAPI()
    add_code_routes(api)
    client = TestClient(api)
    got = client.get("/code/prefix")
    assert got.status_code == 200 and got.text == code_body("prefix")
    assert got.headers["cache-control"].startswith("public") and got.headers["etag"]
    assert client.get("/code/nope").status_code == 404
    assert client.get("/code/%3Cscript%3E").status_code == 404
    assert all(f"data-src='code/{k}'" in code_views()[k] for k in KEYS)
