"""Issue 43 in the classroom: every stage carries its code view (the page's, from this
checkout) and what ran; the presenter opens it for every screen (the room's state says so);
a trace from another checkout names its commit. A real server on loopback, a real engine's trace."""
from __future__ import annotations

import io
import json
import zipfile

import httpx
import pytest

from app.classroom.bundle import bundle_zip
from app.classroom.rooms import Room
from app.page.code_panel import code_body
from tests.service_utils import served
from visualizers.journey import KEYS


@pytest.fixture(scope="module")
def server(service, tmp_path_factory):  # `service` and `recording`: tests/app/conftest.py, a real engine run
    with served(service, tmp_path_factory) as srv:
        yield srv


def _room(server, body: dict) -> dict:
    r = httpx.post(server.url + "classroom", json=body, timeout=60).json()
    r["key"] = r["presenter_url"].split("key=")[1]
    return r


def _stages(server, room: dict) -> dict[str, str]:
    return {d["key"]: d["html"] for d in (httpx.get(server.url + f"classroom/{room['id']}/stage/{i}").json()
                                          for i in range(room["stages"]))}


def test_every_stage_has_its_code_and_the_presenter_opens_it_for_all(server, recording):
    room = _room(server, {"request_id": recording.request_id})
    shown = httpx.post(server.url + f"classroom/{room['id']}/question", json={"key": room["key"], "action": "show"})
    assert shown.status_code == 200  # the answer shown (else hidden until asked: no speculative round to name)
    stages = _stages(server, room)
    for key, html in stages.items():
        assert f"<details class='tt-code-box' data-key='{key}' data-src='code/{key}'>" in html  # closed, as on the page
        assert "tt-code-src" not in html  # its functions come when the presenter opens it (GET /code/{key})
    assert "Ran for this request:" in stages["layers"] and "a draft model" in stages["spec"]
    assert "recorded on commit" not in stages["request"]  # this checkout's own trace
    url = server.url + f"classroom/{room['id']}/"
    assert httpx.get(url + "state").json()["code"] is False
    assert httpx.post(url + "code", json={"key": "wrong", "open": True}).status_code == 403
    got = httpx.post(url + "code", json={"key": room["key"], "open": True})
    assert got.status_code == 200 and got.json()["code"] is True
    assert httpx.get(url + "state").json()["code"] is True  # every screen hears it (classroom.js opens it)
    assert httpx.post(url + "code", json={"key": room["key"], "open": "yes"}).status_code == 400


def test_a_trace_from_another_checkout_names_its_commit(server, recording):
    data = json.loads(recording.dumps())
    data["model"]["commit"] = "f" * 40
    room = _room(server, {"trace": data})
    stages = _stages(server, room)
    assert "⚠ This trace was recorded on commit ffffffffffff" in stages["request"]
    assert "engine/block_manager.py" in stages["prefix"]  # this checkout's code, with the warning
    got = httpx.get(server.url + "code/prefix").text
    assert "match_tokens" in got and "tt-code-src" in got


def test_a_bundle_holds_each_stages_code_view_for_its_phones(recording):
    """A static bundle's page fetches code/KEY.html from its own folder when the presenter opens a view."""
    with zipfile.ZipFile(io.BytesIO(bundle_zip(Room("r", "k", recording), "http://server", ""))) as z:
        for key in KEYS:
            assert z.read(f"code/{key}.html").decode() == code_body(key)
        assert "tt-code-src" not in z.read("stages/2.json").decode()  # the stages carry the closed line only
