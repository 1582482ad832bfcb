"""Issue 6 in a real Chromium: a curl request appears live in a watching page; the page
exports its trace (the same file GET /v1/traces/{id} gives), loads it back and replays
it step by step; classroom mode walks every stage while a second browser context
follows the presenter."""
from __future__ import annotations

import json
import subprocess
import threading
import time

import httpx
import pytest

from tests.browser_utils import (LIVE_STATE, open_page, server_fixture, status, statuses_so_far, wait_said,
                                 wait_status)
from tests.holds import StepGate
from visualizers.journey import JOURNEY

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")]
STAGE_TITLES = [title for _, title in JOURNEY]  # the classroom walks the page's journey


server = server_fixture("--served-model-name", "tiny-moe", delay=0.05)


@pytest.fixture(scope="module")
def watched(server, browser, tmp_path_factory):
    """A page that watches while curl sends the request of the story; -> (page, id, curl's text)."""
    context = browser.new_context(viewport={"width": 1500, "height": 1100}, accept_downloads=True)
    page = open_page(context, server.url)
    page.click("#tt-watch")
    wait_status(page, "watching")
    body = {"model": "tiny-moe", "stream": True, "max_tokens": 24, "temperature": 0.7, "seed": 4,
            "ignore_eos": True, "trace_level": "full", "messages": [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Why is the <sky> blue?"}]}
    got: dict = {}

    def curl() -> None:
        got["out"] = subprocess.run(["curl", "-sN", server.url + "v1/chat/completions", "-H",
                                     "Content-Type: application/json", "-d", json.dumps(body)],
                                    capture_output=True, text=True, timeout=120).stdout

    sender, said = threading.Thread(target=curl), statuses_so_far(page)
    # the engine waits before its 4th step (at most 13 of the 24 tokens made) while the page is read mid-stream
    with pytest.MonkeyPatch.context() as mp:
        gate = StepGate(at=(4,)).install(server.service.engine, mp)
        sender.start()
        try:
            assert gate.reached() == 4
            wait_status(page, "streaming")
            mid = page.evaluate(LIVE_STATE)
            # the controls show the watched request's own knobs while it streams (not only at its end)
            mid["controls"] = {n: page.input_value(f"#tt-{n} input[type=number]")
                               for n in ("temperature", "max-tokens")}
        finally:
            gate.release_all()
        sender.join()
    final = wait_said(page, "waiting for the next request", said)  # it stays while idle
    chunks = [json.loads(line[6:]) for line in got["out"].splitlines() if line.startswith("data: {")]
    rid = chunks[0]["id"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    page.shots = tmp_path_factory.mktemp("replay-shots")
    page.mid, page.final = mid, final
    yield page, rid, text
    context.close()


def test_a_curl_request_appears_live_in_a_watching_page(watched):
    page, rid, text = watched
    assert 0 <= page.mid["tokens"] < 24 and rid in page.final
    assert page.mid["controls"] == {"temperature": "0.7", "max-tokens": "24"}, page.mid  # the page's are 0, 48
    q = page.locator
    assert rid in q("#tt-request").inner_text() and "Why is the <sky> blue?" in q("#tt-request").inner_text()
    assert q("#tt-answer .tt-timed").count() == 24
    assert text and q("#tt-answer .tt-answer").inner_text().strip() == text.strip()  # what curl got, as text
    assert q("#tt-tokens .tt-chips .tt-gen").count() == 24
    for panel in ("tt-prefix", "tt-embedding", "tt-attention", "tt-kv", "tt-moe", "tt-sampling", "tt-spec",
                  "tt-timeline"):
        assert q(f"#{panel} .tt-empty").count() == 0, panel
    page.screenshot(path=str(page.shots / "watched.png"), full_page=True)
    # the finished request is now a recording: scrubbing to its last step shows the same answer
    page.locator("#tt-step input[type=range]").focus()
    page.keyboard.press("ArrowLeft")
    wait_status(page, " of ")
    page.keyboard.press("End")
    n = int(page.evaluate("document.querySelector('#tt-step input[type=range]').max"))  # counted from 1
    wait_status(page, f"step {n} of {n}")
    assert int(page.evaluate("document.querySelector('#tt-step input[type=range]').value")) == n
    page.wait_for_timeout(2500)  # the watch's idle loop (a yield each 2 s) leaves the scrubbed line alone
    assert f"step {n} of {n}" in status(page), status(page)
    assert q("#tt-answer .tt-timed").count() == 24 and q("#tt-tokens .tt-chips .tt-gen").count() == 24


def test_export_then_load_replays_the_same_trace(server, watched, browser, tmp_path):
    page, rid, _ = watched
    with page.expect_download() as download:
        page.click("#tt-export")
    exported = json.loads(open(download.value.path()).read())
    api = httpx.get(server.url + f"v1/traces/{rid}", timeout=30).json()
    assert exported["id"] == rid and exported == api  # the page's file is the recorded trace
    path = tmp_path / download.value.suggested_filename
    path.write_text(json.dumps(exported))

    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    other = open_page(context, server.url)
    with other.expect_file_chooser() as chooser:
        other.click("#tt-load")
    chooser.value.set_files(str(path))
    loaded = wait_status(other, "loaded")
    # one replay step per engine step the request ran in: the timeline's count (issue 25, item 5)
    n = sum(1 for e in exported["events"] if e["type"] == "schedule.step"
            and any(b["request_id"] == rid for b in e["batch"]))
    assert f"step {n} of {n}" in loaded
    assert other.locator("#tt-answer .tt-timed").count() == 24
    other.locator("#tt-step input[type=range]").focus()
    other.keyboard.press("Home")  # scrub to the first engine step: the prefill, which drew the first token
    wait_status(other, f"step 1 of {n}")
    assert other.locator("#tt-answer .tt-timed").count() == 1
    other.locator("#tt-speed input").click()
    other.locator("li[data-value='10 steps/s'], [role=option]:has-text('10 steps/s')").first.click()
    # every count the answer shows is recorded by the page itself as the DOM changes, so a busy
    # machine's slow polls below cannot miss the frames in between
    other.evaluate("""() => { window.ttSeen = new Set(); new MutationObserver(() => window.ttSeen.add(
        document.querySelectorAll('#tt-answer .tt-timed').length)).observe(document.body,
        {childList: true, subtree: true, characterData: true}); }""")
    other.click("#tt-play")
    wait_status(other, "playing")
    seen = set()
    end = time.monotonic() + 60
    while f"step {n} of {n}" not in status(other) or "playing" in status(other):
        assert time.monotonic() < end, status(other)
        seen.add(other.locator("#tt-answer .tt-timed").count())
        other.wait_for_timeout(50)
    assert other.locator("#tt-answer .tt-timed").count() == 24
    seen |= set(other.evaluate("() => [...window.ttSeen]"))
    assert len(seen - {1, 24}) >= 2, seen  # the answer grew frame by frame
    other.screenshot(path=str(page.shots / "replayed.png"), full_page=True)
    context.close()


def test_classroom_walks_every_stage_and_a_second_browser_follows(server, watched, browser):
    page, rid, _ = watched
    page.click("#tt-class-start")
    page.wait_for_selector("#tt-class-presenter")
    presenter_href = page.get_attribute("#tt-class-presenter", "href")
    audience_href = page.get_attribute("#tt-class-audience", "href")
    assert "key=" in presenter_href and "key=" not in audience_href
    base = server.url.rstrip("/")
    teacher_ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
    class_ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    teacher, student = teacher_ctx.new_page(), class_ctx.new_page()
    teacher.goto(base + presenter_href)
    student.goto(base + audience_href)
    # the stages this request has, in the page's order; one device: "Beyond one device" is one line
    dots = [t.split(" · ", 1)[1] for t in teacher.eval_on_selector_all(".tt-class-dot", "bs => bs.map(b => b.title)")]
    assert dots == [t for t in STAGE_TITLES if t != "Beyond one device"]
    assert "skipped by this request: Beyond one device" in student.inner_text("#tt-class-dots")
    titles = dots
    for i, title in enumerate(titles):
        teacher.wait_for_function(f"document.body.dataset.stage === '{i}'", timeout=90_000)
        student.wait_for_function(f"document.body.dataset.stage === '{i}'", timeout=90_000)
        for p in (teacher, student):
            assert title in p.inner_text("#tt-class-title")
            assert len(p.inner_text(".tt-class-text")) > 60
        if title == "Tokenize":  # the words quote this request's numbers
            words = student.inner_text(".tt-class-text")
            n = len(json.loads(httpx.get(server.url + f"v1/traces/{rid}", timeout=30).text)["events"][1]["tokens"])
            assert f"{n} tokens" in words
        if i in (6, 11):
            student.screenshot(path=str(page.shots / f"classroom-{i + 1}.png"))
        teacher.keyboard.press("ArrowRight")
    teacher.keyboard.press("ArrowLeft")
    student.wait_for_function(f"document.body.dataset.stage === '{len(titles) - 2}'", timeout=90_000)
    student.keyboard.press("ArrowLeft")  # a viewer's keys move nothing
    time.sleep(1.0)
    assert teacher.evaluate("document.body.dataset.stage") == str(len(titles) - 2)
    teacher_ctx.close()
    class_ctx.close()
