"""The page's browser tests' shared parts: a paced server for the tiny MoE, Chromium
(Playwright, the system browser), and helpers that drive the page.

Without Chromium or Playwright the tests skip, unless TOKENTRACE_REQUIRE_BROWSER=1 (CI),
where a missing browser is a failure."""
from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

import pytest

import benchmarks.browser
from benchmarks.local_server import LocalServer
from tests.service_utils import app_service, served

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
REQUIRE = os.environ.get("TOKENTRACE_REQUIRE_BROWSER") == "1"
PANELS = ["tt-request", "tt-prefix", "tt-tokens", "tt-embedding", "tt-attention", "tt-kv", "tt-moe", "tt-sampling",
          "tt-spec", "tt-answer", "tt-timeline"]

# Records every number of streamed tokens the answer panel showed, and the most
# other-request KV blocks ever drawn; installed before the page's own scripts run.
WATCH = """
window.__counts = []; window.__maxOther = 0;
new MutationObserver(() => {
  const n = document.querySelectorAll('#tt-answer .tt-timed').length;
  if (!window.__counts.includes(n)) window.__counts.push(n);
  const grid = document.querySelector('#tt-kv .tt-kv-grid');
  const other = grid ? +grid.dataset.other : 0;
  window.__maxOther = Math.max(window.__maxOther, other);
}).observe(document, {subtree: true, childList: true, characterData: true, attributes: true});
// every value the status box was given, in order (a line shown for 2 s is still seen on a busy machine)
window.__statuses = [];
const __value = Object.getOwnPropertyDescriptor(HTMLTextAreaElement.prototype, 'value');
Object.defineProperty(HTMLTextAreaElement.prototype, 'value', {configurable: true,
  get() { return __value.get.call(this); },
  set(v) { __value.set.call(this, v); if (this.closest('#tt-status')) window.__statuses.push(String(v)); }});
"""


LIVE_STATE = """() => ({
  status: document.querySelector('#tt-status textarea').value,
  empty: %s.filter(id => document.querySelector('#' + id + ' .tt-empty')),
  tokens: document.querySelectorAll('#tt-answer .tt-timed').length})""" % PANELS


def browser_or_skip() -> None:
    """Skip (fail, where CI requires the browser) without Playwright or Chromium."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        (pytest.fail if REQUIRE else pytest.skip)("the playwright package is not installed")
    if benchmarks.browser.find_chromium() is None:
        (pytest.fail if REQUIRE else pytest.skip)("no Chromium (apt-get install -y chromium)")


@contextlib.contextmanager
def paced_server(checkpoint, tmp_path_factory, *args: str, delay: float = 0.06) -> Iterator[LocalServer]:
    """The tiny MoE + draft served on loopback; the tiny model is too fast to watch, so each
    engine step is paced and every machine streams for seconds."""
    browser_or_skip()
    svc = app_service(checkpoint, "--num-speculative-tokens", "3", "--num-kv-blocks", "96", *args, draft="mistral",
                      pace_s=delay)
    with served(svc, tmp_path_factory) as srv:
        yield srv


@contextlib.contextmanager
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = benchmarks.browser.launch(pw)
        yield b
        b.close()


def status(page) -> str:
    return page.input_value("#tt-status textarea")


def wait_status(page, text: str, timeout_s: float = 90) -> str:
    """The status once it says `text`; past timeout_s, a failure that quotes what it said."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout  # lazy: Playwright is optional

    try:  # the value that matched, not one read later (a busy page may have moved on)
        return page.wait_for_function(f"(v => v.includes({json.dumps(text)}) && v)"
                                      "(document.querySelector('#tt-status textarea').value)",
                                      timeout=timeout_s * 1000).json_value()
    except PlaywrightTimeout:
        pytest.fail(f"the status never said {text!r} in {timeout_s:.0f} s; it says {status(page)!r}")


def statuses_so_far(page) -> int:
    return page.evaluate("window.__statuses.length")


def wait_said(page, text: str, since: int, timeout_s: float = 90) -> str:
    """The first status given after the first `since` ones that says `text`, however briefly
    it was shown (WATCH records each)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout  # lazy: Playwright is optional

    try:
        return page.wait_for_function(f"window.__statuses.slice({since}).find(v => v.includes({json.dumps(text)}))",
                                      timeout=timeout_s * 1000).json_value()
    except PlaywrightTimeout:
        pytest.fail(f"the status never said {text!r} in {timeout_s:.0f} s; it said {page.evaluate('window.__statuses')}")


def open_page(context, url: str):
    page = context.new_page()
    # every wait with no timeout of its own (a click, a selector): 90 s, not Playwright's 30, so
    # a busy machine is slow, never a failure; a page that never gets there still fails
    page.set_default_timeout(90_000)
    page.dialogs, page.external = [], []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.on("request", lambda r: page.external.append(r.url)
            if not r.url.startswith(("http://127.0.0.1", "data:", "blob:")) else None)
    page.add_init_script(WATCH)
    page.goto(url, wait_until="load")  # the queue stream never lets the network go idle
    page.wait_for_selector("#tt-send")
    return page


def set_controls(page, user: str, max_tokens: int, system: str | None = None) -> None:
    if system is not None:
        page.fill("#tt-system textarea", system)
    page.fill("#tt-user textarea", user)
    number(page, "tt-max-tokens", max_tokens)


def number(page, elem: str, value) -> None:
    """Type a value into a number box (a slider's too), then wait until each of the component's
    inputs shows it: a Send clicked at once after n = 3 ran n = 1 twice in CI (12-02, 12-07), and
    one after min tokens 300 ended its request before the step a test waited for (12-07)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout  # lazy: Playwright is optional

    box = page.locator(f"#{elem} input[type=number]")
    for _ in range(3):  # typed again where the value was lost: once in CI (12-07, min tokens 300 right after the
        box.fill(str(value))  # accordion opened) no input showed it for 90 s; not reproduced since
        box.press("Enter")
        box.blur()  # the slider clamps and releases its value on blur
        try:
            page.wait_for_function("([id, v]) => [...document.querySelectorAll(`#${id} input`)]"
                                   ".every(i => i.type === 'checkbox' || Number(i.value) === v)",
                                   arg=[elem, float(value)], timeout=30_000)
            return
        except PlaywrightTimeout:
            pass
    held = page.evaluate("id => [...document.querySelectorAll(`#${id} input`)].map(i => `${i.type}=${i.value}`)", elem)
    pytest.fail(f"#{elem} never showed {value} after it was typed 3 times: its inputs hold {held}")


def wait_finished(page, timeout_s: float = 120) -> str:
    page.wait_for_function("document.querySelector('#tt-status textarea').value.includes('finished')",
                           timeout=timeout_s * 1000)
    page.wait_for_timeout(300)
    return page.input_value("#tt-status textarea")


def server_fixture(*args: str, delay: float = 0.06):
    """A module-scoped `server` fixture: paced_server(*args, delay) for every test of the module
    that assigns it (`server = server_fixture(delay=0.01)`)."""
    @pytest.fixture(scope="module")
    def server(checkpoint, tmp_path_factory):
        with paced_server(checkpoint, tmp_path_factory, *args, delay=delay) as srv:
            yield srv
    return server


def page_fixture(width: int = 1500, height: int = 1100):
    """A `page` fixture: the served page in a fresh browser context (downloads accepted),
    closed after the test (`page = page_fixture()`)."""
    @pytest.fixture()
    def page(server, browser):
        context = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
        yield open_page(context, server.url)
        context.close()
    return page
