"""Issue 38, item 1 in a real Chromium: one screen. At 1280×720 and 1920×1080 the first
screen holds the prompt, Send, the pipeline map and the answer's box, after load and while
the answer streams; a chip brings its stage's section under the map, the prompt and the
answer still in view; Play and Pause are off with nothing to replay and on once a trace is
loaded, Stop only while there is something to stop; at 420 px the prompt and Send come
first; a phone in the classroom sees the question and the stage. Skips without Chromium
unless TOKENTRACE_REQUIRE_BROWSER=1 (see tests/browser_utils.py)."""
from __future__ import annotations

import pytest

from tests.browser_utils import open_page, server_fixture, set_controls, wait_finished, wait_status
from tests.holds import StepGate

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")]

server = server_fixture(delay=0.05)

FIRST_SCREEN = ("#tt-user", "#tt-send", "#tt-map", "#tt-answer .tt-answer")
BOXES = """(sels) => Object.fromEntries(sels.map(s => { const r = document.querySelector(s).getBoundingClientRect();
  return [s, {top: r.top, bottom: r.bottom, left: r.left, right: r.right, width: r.width}]; }))"""


NAV = """() => { const skip = document.querySelector('.tt-class-skipped').getBoundingClientRect(),
  dots = [...document.querySelectorAll('.tt-class-dot')].map(d => d.getBoundingClientRect());
  return {skip: {top: skip.top, height: skip.height}, line: parseFloat(getComputedStyle(
    document.querySelector('.tt-class-skipped')).lineHeight) || 16, dot_height: Math.max(...dots.map(d => d.height)),
    dots_bottom: Math.max(...dots.map(d => d.bottom)), dots_rows: new Set(dots.map(d => Math.round(d.top))).size}; }"""
TO_TOP = "() => { window.scrollTo(0, 0); document.getElementById('tt-controls').scrollTop = 0; }"


def off_screen(page, width: int, height: int, selectors=FIRST_SCREEN) -> dict:
    """The selectors whose box is not wholly inside the viewport (nothing scrolled)."""
    boxes = page.evaluate(BOXES, list(selectors))
    return {s: b for s, b in boxes.items()
            if b["width"] == 0 or b["top"] < 0 or b["bottom"] > height or b["left"] < 0 or b["right"] > width}


def disabled(page, selector: str) -> bool:
    return page.locator(selector).is_disabled()


@pytest.mark.parametrize("width,height", [(1280, 720), (1920, 1080)])
def test_the_first_screen_holds_the_prompt_send_the_map_and_the_answer(server, browser, width, height, monkeypatch):
    context = browser.new_context(viewport={"width": width, "height": height})
    page = open_page(context, server.url)
    page.wait_for_selector("#tt-map .tt-map-chip")
    assert not off_screen(page, width, height), off_screen(page, width, height)
    assert page.evaluate("window.scrollY") == 0
    assert disabled(page, "#tt-play") and disabled(page, "#tt-pause")  # nothing to replay yet
    assert disabled(page, "#tt-stop")  # nothing to stop
    set_controls(page, "Tell me a long story about a fox and an owl.", 40)
    page.evaluate(TO_TOP)  # typing in the max-tokens box scrolled the sidebar down to it
    gate = StepGate(at=(6,)).install(server.service.engine, monkeypatch)  # 5 of the 40 tokens: still streaming
    try:
        page.click("#tt-send")
        assert gate.reached() == 6
        page.wait_for_function("/streaming, [1-9]\\d* tokens?$/.test(document.querySelector('#tt-status textarea').value)",
                               timeout=90_000)
        assert not off_screen(page, width, height), off_screen(page, width, height)  # while it streams
        assert not disabled(page, "#tt-stop")
        # a chip (KV pages: far down the page) brings its section to just under the map, beside the answer
        page.click("#tt-map .tt-map-chip[data-key=kv]")
        page.wait_for_function(f"""() => {{ const s = document.getElementById('tt-stage-kv').getBoundingClientRect(),
          m = document.getElementById('tt-map').getBoundingClientRect();
          return m.bottom - 2 <= s.top && s.top < {height * 0.5}; }}""", timeout=30_000)  # the scroll may glide
        assert not off_screen(page, width, height), off_screen(page, width, height)  # the map and the answer stay
        assert "outline" in page.evaluate("document.getElementById('tt-map-selection').textContent")
    finally:
        gate.release_all()
    wait_finished(page)
    page.wait_for_function("!document.querySelector('#tt-play').disabled")  # its recording: replayable
    context.close()


def test_play_waits_for_a_loaded_trace(server, browser, tmp_path):
    context = browser.new_context(viewport={"width": 1280, "height": 720}, accept_downloads=True)
    page = open_page(context, server.url)
    set_controls(page, "Hi there.", 6)
    page.click("#tt-send")
    wait_finished(page)
    page.wait_for_function("!document.querySelector('#tt-export').disabled")
    with page.expect_download() as d:
        page.click("#tt-export")
    path = tmp_path / "trace.json"
    d.value.save_as(path)
    fresh = open_page(context, server.url)
    fresh.wait_for_selector("#tt-map .tt-map-chip")
    assert disabled(fresh, "#tt-play") and disabled(fresh, "#tt-pause")
    with fresh.expect_file_chooser() as chooser:
        fresh.click("#tt-load")
    chooser.value.set_files(str(path))
    wait_status(fresh, "loaded")
    fresh.wait_for_function("!document.querySelector('#tt-play').disabled && "
                            "!document.querySelector('#tt-pause').disabled")
    context.close()


def test_on_a_phone_the_prompt_and_send_come_first(server, browser):
    context = browser.new_context(viewport={"width": 420, "height": 900})
    page = open_page(context, server.url)
    page.wait_for_selector("#tt-map .tt-map-chip")
    assert not off_screen(page, 420, 900, ("#tt-user", "#tt-send")), off_screen(page, 420, 900, ("#tt-user", "#tt-send"))
    tops = page.evaluate(BOXES, ["#tt-user", "#tt-send", "#tt-map", "#tt-model", "#tt-step-row", "#tt-temperature"])
    first = max(tops["#tt-user"]["bottom"], tops["#tt-send"]["bottom"])
    assert all(first <= tops[s]["top"] for s in ("#tt-map", "#tt-model", "#tt-step-row", "#tt-temperature")), tops
    context.close()


def test_a_phone_in_the_classroom_sees_the_question_and_the_stage(server, browser):
    """The audience's 420 × 800 phone: the question, the stage's heading and its first sentence
    without scrolling (the projector's 22 px type pushed the stage below the question)."""
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = open_page(context, server.url)
    set_controls(page, "Hi there.", 6)
    page.click("#tt-send")
    wait_finished(page)
    page.click("#tt-class-start")
    page.wait_for_selector("#tt-class-links a")
    links = page.eval_on_selector_all("#tt-class-links a", "as => as.map(a => a.href)")
    presenter = next(u for u in links if "key=" in u)
    audience = next(u for u in links if "key=" not in u)
    lead = context.new_page()
    lead.goto(presenter)
    lead.click("#tt-q-open")
    phone = browser.new_context(viewport={"width": 420, "height": 800}).new_page()
    phone.goto(audience)
    phone.wait_for_selector("#tt-class-q .tt-q-choice")
    phone.wait_for_selector("#tt-class-title")
    shown = ("#tt-class-q", "#tt-class-title", ".tt-class-text p", ".tt-class-skipped", ".tt-class-dot.tt-on")
    assert not off_screen(phone, 420, 800, shown), off_screen(phone, 420, 800, shown)
    # the skipped stages on one line of their own, not squeezed beside the dots (it was a column a word
    # wide, cut off at the screen's edge, that stretched every dot to its height)
    nav = phone.evaluate(NAV)
    assert nav["skip"]["height"] < 2 * nav["line"] and nav["skip"]["top"] >= nav["dots_bottom"], nav
    assert nav["dot_height"] < 2 * nav["line"] and nav["dots_rows"] == 1, nav
    phone.context.close()
    # the presenter on a phone too: the question with its Reveal, the stage's heading and first sentence
    lead_phone = browser.new_context(viewport={"width": 420, "height": 800}).new_page()
    lead_phone.goto(presenter)
    lead_phone.wait_for_selector("#tt-class-q #tt-q-reveal")
    lead_phone.wait_for_selector("#tt-class-title")
    shown = ("#tt-class-q", "#tt-q-reveal", "#tt-class-title", ".tt-class-text p", ".tt-class-skipped")
    assert not off_screen(lead_phone, 420, 800, shown), off_screen(lead_phone, 420, 800, shown)
    lead_phone.context.close()
    context.close()
