"""Issue 39 items 3 and 8: a server restarted (SIGTERM, then started again on the same port and
database) under a room with an audience connected: the presenter's link answers, the audience's
page (a real Chromium, never reloaded) reconnects by itself and shows the same stage and the open
question with its vote, and a presenter's move after the restart reaches it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.app.store.test_crash import _port
from tests.browser_utils import chromium
from tests.paths import ROOT

pytestmark = pytest.mark.slow  # two `python -m app` processes, one after the other, and Chromium


def _start(args: list[str], port: int, tmp_path) -> subprocess.Popen:
    env = {**os.environ, "HOME": str(tmp_path), "GRADIO_TEMP_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1",
           "TOKENTRACE_API_KEY": ""}
    proc = subprocess.Popen([sys.executable, "-m", "app", *args, "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("the server did not start")


def _stop(proc: subprocess.Popen) -> str:
    os.killpg(proc.pid, signal.SIGTERM)  # as a service manager stops it: queued writes go in first
    out, _ = proc.communicate(timeout=60)
    return out


def _wait(page, condition: str, timeout_s: float = 60) -> None:
    page.wait_for_function(condition, timeout=timeout_s * 1000)


def test_a_restart_under_an_audience(checkpoint, tmp_path):
    port, db = _port(), tmp_path / "traces.db"
    args = ["--model", str(checkpoint("llama")), "--draft", "none", "--db", str(db)]
    url = f"http://127.0.0.1:{port}"
    proc = _start(args, port, tmp_path)
    try:
        body = {"messages": [{"role": "user", "content": "Foxes and owls"}], "max_tokens": 6, "temperature": 0.8,
                "seed": 3, "trace_level": "full"}
        rid = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()["id"]
        room = httpx.post(url + "/classroom", json={"request_id": rid}, timeout=60).json()
        key = room["presenter_url"].split("key=")[1]
        api = f"{url}/classroom/{room['id']}"
        assert httpx.post(api + "/goto", json={"key": key, "stage": 3}).status_code == 200
        assert httpx.post(api + "/question", json={"key": key, "action": "open"}, timeout=60).status_code == 200
        assert httpx.post(api + "/vote", json={"choice": 1, "voter": "student-one"}).status_code == 200
        with chromium() as browser:
            page = browser.new_page()
            page.goto(url + room["audience_url"])
            _wait(page, "document.body.dataset.stage === '3' && document.body.dataset.question === 'open'")
            _wait(page, "document.getElementById('tt-q-count').textContent.startsWith('1 vote')")
            page.evaluate("window.ttSamePage = true")  # gone if the page reloads
            out = _stop(proc)
            _wait(page, "document.body.dataset.link === 'lost'", 20)
            proc = _start(args, port, tmp_path)
            said = [proc.stdout.readline()]
            while not said[-1].startswith("TokenTrace:"):  # the start-up's lines, up to "ready"
                said.append(proc.stdout.readline())
            assert any(line.startswith("classrooms: 1 room(s) back") for line in said), (said, out)
            presenter = httpx.get(url + room["presenter_url"], timeout=60)
            assert presenter.status_code == 200 and "tt-class-next" in presenter.text  # the key still works
            _wait(page, "document.body.dataset.link === 'live' && document.body.dataset.stage === '3'")
            assert page.evaluate("window.ttSamePage === true")
            assert page.evaluate("document.body.dataset.question") == "open"
            assert page.inner_text("#tt-q-count").startswith("1 vote")
            assert httpx.post(api + "/goto", json={"key": key, "stage": 5}).status_code == 200
            _wait(page, "document.body.dataset.stage === '5'", 20)
            assert page.evaluate("window.ttSamePage === true")
    finally:
        if proc.poll() is None:  # done with it: no need to wait for its graceful stop
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
