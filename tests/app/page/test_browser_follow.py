"""Issue 38, item 1 in a real Chromium: the answer as it streams is on the first screen. A long
answer outgrows the sidebar's 150 px text box; its newest lines stay in view while it streams
(each update replaced the box's HTML at its top: at 1280×720 a projector showed the answer's first
lines while the newest scrolled out of sight, app/page/follow.js); a reader who scrolls it up keeps
that place. The embedded model (its words are several characters a token, the tiny model's one
byte), paced, held by its engine's steps. Skips without Chromium unless TOKENTRACE_REQUIRE_BROWSER=1."""
from __future__ import annotations

import pytest

from tests.browser_utils import browser_or_skip, number, open_page, set_controls, wait_finished
from tests.holds import StepGate
from tests.service_utils import app_service, served

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")]

FOLLOW = """() => { const a = document.querySelector('#tt-answer .tt-answer');
  return {over: a.scrollHeight - a.clientHeight, top: a.scrollTop, bottom: a.scrollTop + a.clientHeight >= a.scrollHeight - 4,
          status: document.querySelector('#tt-status textarea').value}; }"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    browser_or_skip()
    with served(app_service(None, model=None, pace_s=0.02), tmp_path_factory) as srv:
        yield srv


def streaming(n_tokens: str) -> str:
    """A page function: the status streams with a token count that matches the regex part."""
    return f"/streaming, {n_tokens} tokens/.test(document.querySelector('#tt-status textarea').value)"


def test_the_answer_box_shows_its_newest_lines_as_it_streams(server, browser, monkeypatch):
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = open_page(context, server.url)
    set_controls(page, "Tell me a long story about a fox and an owl.", 300)
    page.uncheck("#tt-speculative input")  # one token a step: the gates' steps count the tokens
    page.click("#tt-more > button")
    number(page, "tt-min-tokens", 300)  # no end of turn before it
    gate = StepGate(at=(150, 200)).install(server.service.engine, monkeypatch)
    try:
        page.click("#tt-send")
        assert gate.reached() == 150
        page.wait_for_function(streaming("14\\d"), timeout=90_000)
        page.wait_for_function(f"({FOLLOW})().over > 40", timeout=30_000)
        got = page.evaluate(FOLLOW)
        assert got["bottom"], got  # the newest text in view, not the answer's first lines
        page.evaluate("document.querySelector('#tt-answer .tt-answer').scrollTop = 0")  # the reader scrolls up
        page.wait_for_timeout(300)
        gate.release(150)
        assert gate.reached() == 200
        page.wait_for_function(streaming("19\\d"), timeout=90_000)
        got = page.evaluate(FOLLOW)
        assert got["top"] == 0 and not got["bottom"], got  # kept where the reader left it
    finally:
        gate.release_all()
    wait_finished(page)
    context.close()
