"""Issue 43 in a real Chromium: each stage's code view is one closed line under its sentence,
and a page load carries nothing more of it; a click fetches (GET /code/{key}) and opens the
engine's functions for the stage, highlighted, numbered, read from this checkout, the
request's values written beside the lines that made them; after a request the layers' and
speculation's sentences say which way ran. In the classroom the audience fetches a view only
when the presenter opens it."""
from __future__ import annotations

import re
import time

import httpx
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from engine.code_source import ROOT
from app.page.code_panel import stages
from tests.browser_utils import open_page, page_fixture, server_fixture, set_controls, wait_finished

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")]

server = server_fixture("--served-model-name", "tiny-moe", delay=0.01)
page = page_fixture(width=1500, height=1100)


def test_a_page_load_carries_no_code_until_a_view_opens(server, browser):
    config = httpx.get(server.url + "config", timeout=60).text
    assert "tt-code-src" not in config and "data-src='code/prefix'" in config  # the closed lines only
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    fetched = []
    context.on("request", lambda r: fetched.append(r.url) if "/code/" in r.url else None)
    page = open_page(context, server.url)
    page.wait_for_timeout(500)
    assert fetched == [] and page.locator(".tt-code-src").count() == 0
    page.locator("#tt-code-tokens summary").click()
    page.locator("#tt-code-tokens .tt-code-src").first.wait_for(state="visible")
    assert fetched == [server.url + "code/tokens"]
    page.locator("#tt-code-tokens summary").click()  # closed and opened again: fetched once, shown once
    page.locator("#tt-code-tokens summary").click()
    page.wait_for_timeout(300)
    assert len(fetched) == 1 and page.locator("#tt-code-tokens .tt-code-fn").count() == len(stages()["tokens"])
    context.close()


def test_a_stage_opens_its_code_from_this_checkout(page, tmp_path_factory):
    shots = tmp_path_factory.mktemp("code-shots")
    for _ in range(2):  # the second hits the first's blocks in the prefix cache
        set_controls(page, "Why is the sky blue? Tell me about the air and the light of the sun, please.", 8)
        page.click("#tt-send")
        wait_finished(page)
    box = page.locator("#tt-code-prefix details.tt-code-box")
    assert box.count() == 1 and box.get_attribute("open") is None  # quiet: closed, one line
    summary = box.locator("summary").inner_text()
    assert re.fullmatch(r"The code of this stage: engine/block_manager\.py:\d+ chain_hash and 2 more", summary)
    assert not box.locator(".tt-code-src").first.is_visible()
    page.click("#tt-map a[data-key='prefix']")  # the chip brings the section under the map
    page.wait_for_timeout(500)  # (its smooth scroll)
    page.screenshot(path=str(shots / "prefix-closed.png"))
    box.locator("summary").click()
    src = box.locator(".tt-code-src").first
    src.wait_for(state="visible")
    first = int(src.locator(".tt-cl i").first.inner_text())
    file_lines = (ROOT / "engine/block_manager.py").read_text().splitlines()
    shown = src.inner_text().splitlines()
    assert shown[0] == f"{first}{file_lines[first - 1]}"  # its number, then line n of the file as the file has it
    assert box.locator(".tt-code-src .tt-cm").count() >= 2  # the lines that make the hit or the miss
    assert box.locator(".tt-code-src .k").count() > 0  # highlighted
    beside = "getComputedStyle(document.querySelector(\"#tt-code-{} .tt-cl[data-v='{}']\"), '::after').content"
    hits = page.evaluate(beside.format("prefix", "prefix.hits"))
    assert re.fullmatch(r'"  ← hits = \[\d+(, \d+)*\] of \d+ full blocks"', hits), hits  # the request's value
    box.locator(".tt-cl[data-v='prefix.hits']").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "prefix-code.png"))
    page.locator("#tt-code-sampling summary").click()
    page.locator("#tt-code-sampling .tt-code-src").first.wait_for(state="visible")
    assert page.evaluate(beside.format("sampling", "sampling.greedy")).startswith('"  ← greedy: token ')  # the page's
    page.locator("#tt-code-sampling .tt-cl[data-v='sampling.greedy']").scroll_into_view_if_needed()  # temperature 0
    page.screenshot(path=str(shots / "sampling-values.png"))
    layers = page.locator("#tt-stage-text-layers").inner_text()
    assert "Ran for this request:" in layers and "Not taken here:" in layers
    assert "Ran for this request:" in page.locator("#tt-stage-text-spec").inner_text()  # a draft model
    page.locator("#tt-code-layers summary").click()
    page.locator("#tt-code-layers .tt-code-src").first.wait_for(state="visible")
    fn = "#tt-code-layers .tt-code-fn[data-path='{}'] .tt-way-{}"  # the view drawn once, marked by the request's style
    assert page.locator(fn.format("c_fused", "ran")).is_visible()
    assert not page.locator(fn.format("c_fused", "not")).is_visible()
    assert page.locator(fn.format("triton", "not")).first.is_visible()
    assert page.locator("#tt-code-layers .tt-code-fn[data-path^='moe_'] .tt-way-ran:visible").count() == 1  # the MoE's
    assert "moe.picks" in page.evaluate(  # the router's picks beside the line that keeps them, in the way that ran
        "[...document.querySelectorAll('#tt-code-layers .tt-cl[data-v]')].filter(l => l.offsetParent)"
        ".map(l => l.dataset.v + getComputedStyle(l, '::after').content).join()")
    page.click("#tt-map a[data-key='layers']")  # its sentence (what ran) and its code under the map
    page.screenshot(path=str(shots / "layers-code.png"))
    print("screenshots:", shots)


def where(screen) -> dict:
    """A classroom screen's stage, link and code box, as its script left them."""
    return screen.evaluate("({stage: document.body.dataset.stage, link: document.body.dataset.link, "
                           "key: document.querySelector('#tt-class-stage details.tt-code-box')?.dataset.key, "
                           "active: document.activeElement && document.activeElement.tagName, url: location.href})")


def test_the_presenter_opens_a_stages_code_for_the_audience(server, browser, tmp_path_factory):
    shots = tmp_path_factory.mktemp("class-code-shots")
    body = {"model": "tiny-moe", "max_tokens": 6, "trace_level": "full",
            "messages": [{"role": "user", "content": "Hi"}]}  # a short prompt: no full block to hash
    rid = httpx.post(server.url + "v1/chat/completions", json=body, timeout=120).json()["id"]
    # a room of the finished trace: its `finish` follows the lenses computed after the answer (a room
    # made before would grow when it comes, a stage count that moves under the presenter's keys)
    end = time.monotonic() + 60
    while not any(e["type"] == "finish" for e in httpx.get(server.url + f"v1/traces/{rid}", timeout=60).json()["events"]):
        assert time.monotonic() < end, "the trace did not end"
        time.sleep(0.1)
    room = httpx.post(server.url + "classroom", json={"request_id": rid}, timeout=60).json()
    screens, fetched = [], []
    for url in (room["presenter_url"], room["audience_url"]):
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.on("request", lambda r, who=url: fetched.append((who, r.url)) if "/code/" in r.url else None)
        screen = context.new_page()
        screen.set_default_timeout(60_000)
        screen.goto(server.url.rstrip("/") + url)
        screen.wait_for_selector("#tt-class-stage details.tt-code-box")
        screen.wait_for_function("document.body.dataset.link === 'live'")  # the room's state heard: keys move it
        screens.append(screen)
    presenter, audience = screens
    presenter.keyboard.press("ArrowRight")
    presenter.keyboard.press("ArrowRight")  # the prefix cache
    try:
        audience.wait_for_function("document.querySelector('#tt-class-stage details.tt-code-box').dataset.key "
                                   "=== 'prefix'")
    except PlaywrightTimeout:  # (seen twice in CI, 2026-12-06, never alone: say where each screen stood)
        state = httpx.get(server.url + f"classroom/{room['id']}/state", timeout=30)
        raise AssertionError(f"presenter {where(presenter)}, audience {where(audience)}, "
                             f"room {state.status_code} {state.text[:300]}") from None
    assert audience.locator("#tt-class-stage details.tt-code-box").get_attribute("open") is None
    assert fetched == []  # no screen has fetched a view: the presenter has not opened one
    presenter.locator("#tt-class-stage details.tt-code-box summary").click()
    audience.wait_for_selector("#tt-class-stage details.tt-code-box[open] .tt-code-src", state="visible")
    assert (room["audience_url"], server.url + "code/prefix") in fetched
    lines = [audience.locator("#tt-class-stage .tt-code-src").nth(i).inner_text() for i in range(3)]
    assert lines == [presenter.locator("#tt-class-stage .tt-code-src").nth(i).inner_text() for i in range(3)]
    audience.locator("#tt-class-stage .tt-code-fn").first.scroll_into_view_if_needed()
    audience.screenshot(path=str(shots / "audience-prefix-code.png"))
    presenter.keyboard.press("ArrowRight")  # the next stage opens its code too, on every screen
    audience.wait_for_selector("#tt-class-stage details.tt-code-box[data-key='embedding'][open]")
    print("screenshots:", shots)
    for screen in screens:
        screen.context.close()

