"""One behaviour for a second Send on every model: it stops the request this tab is streaming
and sends the new prompt. (It used to be refused while the first streamed, which made the
outcome hang on the model's speed: the embedded model had already finished, so the second
Send ran; SmolLM2 was still streaming, so it was refused.) Issue 38, item 9. The first request
is held by its engine's steps until it is stopped, so the machine's speed decides nothing."""
from __future__ import annotations

import threading
import time

import pytest

from app.page.controller import Controller, Controls
from tests.holds import UntilAbort
from tests.service_utils import app_service, started

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")


@pytest.fixture(scope="module")
def embedded():
    with started(app_service(None, model=None)) as svc:
        yield svc


@pytest.mark.parametrize("which", ["tiny_moe", "embedded"])
def test_a_second_send_stops_the_first_and_sends_the_new_prompt(which, request, monkeypatch):
    svc = request.getfixturevalue("service" if which == "tiny_moe" else "embedded")
    ctl = Controller(svc)
    held = UntilAbort(after=3).install(svc.engine, monkeypatch)  # the first streams until it is stopped
    name = ctl.model["name"]
    first: list[dict] = []
    c = Controls(user="A first, long answer.", max_tokens=100, seed="3", level="off", model=name, speculative=False)
    sender = threading.Thread(target=lambda: first.extend(ctl.run("tab", c)), daemon=True)
    sender.start()
    end = time.monotonic() + 60
    while not (ctl.view_of("tab").request_id and ctl.view_of("tab").outputs) and time.monotonic() < end:
        time.sleep(0.01)  # until the first request streams (its hold keeps it streaming)
    first_view = ctl.view_of("tab")
    rid = first_view.request_id
    second = list(ctl.run("tab", Controls(**{**c.as_dict(), "user": "The second prompt.", "max_tokens": 2})))
    ctl.stop("tab")  # nothing left to stop (were the second refused, this ends the first)
    sender.join(60)
    # only the first was stopped (a second abort of it, by its cancelled stream, changes nothing)
    assert set(held.aborted) == {rid} and not sender.is_alive() and first_view.outputs[-1]["finish_reason"] == "abort"
    assert not any("finished" in str(u.get("status", "")) for u in first)  # its last updates: the second's
    assert not any("Not sent" in str(u.get("hint_send", "")) for u in second)
    assert "finished (length), 2 tokens" in second[-1]["status"] and rid not in second[-1]["status"]
    assert "The second prompt." in str(ctl.view_of("tab").body)
