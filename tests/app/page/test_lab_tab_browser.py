"""The Experiments tab in a real Chromium: run the routing experiment at size ci on the
embedded model from the tab, watch its progress, see its figures drawn by plotly.js from this
server (no request leaves the machine), the sentences, the exports; a second Run meanwhile is
refused with a clear message. Skips without Chromium unless TOKENTRACE_REQUIRE_BROWSER=1."""
from __future__ import annotations

import json
import threading
import time

import pytest

from app.__main__ import build_services, parse_args
from tests.browser_utils import browser_or_skip, open_page
from tests.service_utils import served

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")]


# A run holds after its first progress report until the test has looked (LOOKED) or the run is
# cancelled: the tiny model's ci run would otherwise end before a test could look.
LOOKED = threading.Event()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    browser_or_skip()
    from app.page import lab_tab
    real = lab_tab.run

    def held(*args, progress=None, cancelled=lambda: False, **kw):
        first = threading.Event()

        def report(p):
            progress(p)
            if not first.is_set():
                first.set()
                t = time.monotonic()
                while not (LOOKED.is_set() or cancelled()) and time.monotonic() - t < 120:
                    time.sleep(0.02)
                LOOKED.clear()
        return real(*args, progress=report, cancelled=cancelled, **kw)

    models = build_services(parse_args(["--draft", "none", "--num-kv-blocks", "64"]), say=lambda _: None)
    with pytest.MonkeyPatch.context() as mp, served(models, tmp_path_factory) as srv:
        mp.setattr(lab_tab, "run", held)
        yield srv


def test_an_experiment_runs_from_the_tab_and_its_figures_render(server, browser, shots):
    context = browser.new_context(viewport={"width": 1400, "height": 1100}, accept_downloads=True)
    page = open_page(context, server.url)
    other = open_page(context, server.url)
    page.click("#tt-tab-lab-button, button[role=tab]:has-text('Experiments')")
    page.wait_for_selector("#tt-lab-run")
    assert page.locator("#tt-lab-off").count() == 0  # a local server: experiments on
    page.locator("#tt-lab-exp input").click()
    page.get_by_role("option", name="Prefix caching and routing across replicas").click()
    page.click("#tt-lab-run")
    # progress: which setting, what it does, a bar
    page.wait_for_function("() => { const p = document.querySelector('#tt-lab-progress-box .tt-lab-what');"
                           " return p && p.textContent.includes('setting 1 of 3'); }", timeout=120_000)
    assert "round-robin" in page.inner_text("#tt-lab-progress-box")
    # meanwhile another tab's Run is refused, visibly
    other.click("button[role=tab]:has-text('Experiments')")
    other.click("#tt-lab-run")
    other.wait_for_selector("#tt-lab-refused", timeout=90_000)
    assert "Another experiment is running" in other.inner_text("#tt-lab-refused")
    LOOKED.set()  # the run goes on
    # the figures, drawn inside the result's frame
    page.wait_for_selector("#tt-lab-figures", timeout=240_000)
    frame = page.frame_locator("#tt-lab-figures")
    frame.locator("body[data-drawn='4']").wait_for(timeout=60_000)
    assert frame.locator(".js-plotly-plot").count() == 4
    assert frame.locator(".js-plotly-plot .main-svg").count() >= 4  # plotly drew them (an SVG each)
    bars = frame.locator("#fig0 .trace.bars").count()
    assert bars == 3  # prefill vs cached: one bar trace per router
    said = page.inner_text("#tt-lab-result-box")
    assert "prefix-aware routing computed" in said and "round-robin" in said
    assert "done in" in page.inner_text("#tt-lab-progress-box")
    # the exports: the JSON is the result, the HTML page carries plotly.js itself
    with page.expect_download() as got:
        page.locator("#tt-lab-json a").first.click()
    result = json.loads(open(got.value.path()).read())
    assert result["experiment"] == "routing" and len(result["settings"]) == 3
    assert result["sentences"][0] in said
    page.locator("#tt-lab-result-box").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "lab_tab_routing.png"), full_page=True)
    # the result in the classroom, as a stage of its own: the same figures, drawn there too
    page.click("#tt-lab-class")
    page.wait_for_selector("#tt-lab-presenter", timeout=90_000)
    room = context.new_page()
    room.goto(server.url.rstrip("/") + page.get_attribute("#tt-lab-presenter", "href"))
    room.wait_for_selector("#tt-class-title")
    assert room.inner_text("#tt-class-title") == "Experiment: Prefix caching and routing across replicas"
    room.frame_locator("#tt-lab-figures").locator("body[data-drawn='4']").wait_for(timeout=60_000)
    assert result["sentences"][1] in room.inner_text(".tt-class-text")
    room.screenshot(path=str(shots / "lab_classroom_stage.png"))
    # Run again, then Cancel (which lets the held run go on): it stops at the next step and says so
    page.click("#tt-lab-run")
    page.wait_for_function("() => (document.querySelector('#tt-lab-progress-box .tt-lab-what') || {})"
                           ".textContent?.includes('setting 1 of 3')", timeout=120_000)
    page.click("#tt-lab-cancel")
    page.wait_for_function("() => document.querySelector('#tt-lab-progress-box').textContent.includes('cancelled in')",
                           timeout=120_000)
    assert "Cancelled after" in page.inner_text("#tt-lab-result-box")
    assert page.external == [] and other.external == []  # plotly.js came from this server
    assert page.dialogs == []
    context.close()
