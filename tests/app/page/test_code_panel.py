"""The page's code views (app/page/code_panel.py): one closed view a stage, drawn from this
checkout; the stages' sentences gain what this request ran; a trace from another checkout
says which commit it came from."""
from __future__ import annotations

import re

from app.page.code_panel import code_body, code_views, commit_note, with_code
from app.page.page_state import stages_of
from engine import checkout_commit
from tests.trace_views import view as traced_view
from visualizers.journey import KEYS, Stage

EVENTS = [{"type": "schedule.step", "request_id": None, "step": 1, "attention": "c_fused",
           "batch": [{"request_id": "r", "kind": "prefill"}]},
          {"type": "prefix_cache.lookup", "request_id": "r", "step": 1, "cached_blocks": [], "full_blocks": 1}]


def test_every_stage_has_one_closed_view_its_functions_fetched_on_opening():
    views = code_views()
    assert set(views) == set(KEYS)
    for key, h in views.items():
        assert h.startswith(f"<details class='tt-code-box' data-key='{key}' data-src='code/{key}'>")
        assert "The code of this stage: " in h and "not found" not in h
        assert "tt-code-src" not in h and len(h) < 400  # the line alone: the functions come on opening
        body = code_body(key)
        assert "<pre class='tt-code-src'>" in body and "not found" not in body
    assert "The code of this stage: engine/block_manager.py" in views["prefix"]
    assert "chain_hash" in code_body("prefix")
    assert "The code of this stage: app/api/openai_routes.py" in views["request"]  # the app's intake first


def test_the_sentences_gain_what_ran():
    stages = [Stage(k, k, "<p>words</p>", ()) for k in KEYS]
    model = {"commit": checkout_commit()}
    out = {s.key: s.text for s in with_code(stages, model, EVENTS, "r")}
    assert "Ran for this request:" in out["layers"] and "the fused C layer" in out["layers"]
    assert re.search(r"in step 1 \(<code>engine/layers/fused\.py:\d+ forward</code>\)", out["layers"])  # code as code
    assert "Not taken here:" in out["layers"]
    assert "missed: nothing reused" in out["prefix"]
    assert out["embedding"] == "<p>words</p>"  # nothing to say: unchanged
    assert with_code(stages, model, EVENTS, "") == stages  # no request yet


def test_a_trace_from_another_checkout_names_its_commit():
    assert commit_note({"commit": checkout_commit()}) == ""
    note = commit_note({"commit": "0123456789abcdef" * 2 + "01234567"})
    assert "recorded on commit 0123456789ab" in note and "this checkout's" in note
    assert "does not name its commit" in commit_note({})
    stages = [Stage(k, k, "", ()) for k in KEYS]
    out = with_code(stages, {"commit": "f" * 40}, EVENTS, "r")
    assert "⚠ This trace was recorded on commit ffffffffffff" in out[0].text


def test_a_replayed_trace_shows_the_warning_in_its_request_stage():
    view = traced_view()
    view.model = {**view.model, "commit": "e" * 40}
    said = {s.key: s.text for s in stages_of(view)}
    assert "recorded on commit eeeeeeeeeeee" in said["request"]
    assert "Ran for this request" not in said["layers"]  # this trace predates schedule.step's attention


def test_an_open_view_speaks_its_readers_language_and_is_cached_apart():
    """Issue 42: the functions' lines of an open view (GET /code/KEY?lang=...) in the reader's
    language; the code itself as written; each language its own ETag (a browser never takes one
    language's view for the other's)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from app.page.code_panel import add_code_routes
    from tests.app.page.chinese_prose import english
    assert "一个块的键" in code_body("prefix", "zh_CN") and "the key of the block before it" in code_body("prefix")
    for key in KEYS:
        assert not english(code_body(key, "zh_CN")), (key, sorted(set(english(code_body(key, "zh_CN")))))
    assert "code/prefix?lang=zh_CN" in code_views("zh_CN")["prefix"] and "data-src='code/prefix'" in code_views()["prefix"]
    api = FastAPI()
    add_code_routes(api)
    with TestClient(api) as client:
        zh, en, odd = (client.get("/code/prefix", params={"lang": t}) for t in ("zh-CN", "en", "xx"))
    assert zh.status_code == en.status_code == odd.status_code == 200
    assert "一个块的键" in zh.text and en.text == odd.text == code_body("prefix")  # an unknown language: English
    assert zh.headers["etag"] != en.headers["etag"]
