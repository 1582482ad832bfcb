"""Issue 25, items 2, 6 and 7, in a real Chromium (what the last session saw on screen and left):
one picture never shows two forward passes while a request streams; a replay at capture level
off counts the engine steps its timeline says it has; a request stopped before any engine step
says so in the map and the stages (no "not reached yet", no "no token sampled yet"); Stop is
not red once an answer has finished, on a first load at 420 px. Skips without Chromium unless
TOKENTRACE_REQUIRE_BROWSER=1 (see tests/browser_utils.py)."""
from __future__ import annotations

import re
import threading

import httpx
import pytest

from tests.browser_utils import number, open_page, page_fixture, server_fixture, set_controls, status, wait_status
from tests.holds import StepGate

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")]

# every animation frame (what the screen shows): the pass each selected panel names
PASSES = """() => {
  window.__mixed = []; window.__passes = {}; window.__frames = 0;
  const ids = ['tt-embedding', 'tt-attention', 'tt-kv', 'tt-moe', 'tt-sampling', 'tt-spec', 'tt-logit-lens'];
  const tick = () => {
    const got = {};
    for (const id of ids) {
      const el = document.querySelector('#' + id + ' .tt-sel-pass');
      const m = el && /\\(position (\\d+)\\) and predicted/.exec(el.textContent);
      if (m) got[id] = +m[1];
    }
    const vals = new Set(Object.values(got));
    if (vals.size > 1 && window.__mixed.length < 10) window.__mixed.push(got);
    for (const id in got) window.__passes[id] = (window.__passes[id] || 0) + 1;
    window.__frames++;
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}"""


# one sequence at a time: a request sent while another runs waits, and Stop ends it before any step
server = server_fixture("--max-num-seqs", "1", delay=0.05)


page = page_fixture()


def finish(page, before: str) -> str:
    page.wait_for_function("([old]) => { const v = document.querySelector('#tt-status textarea').value;"
                           " return v !== old && v.includes('finished'); }", arg=[before], timeout=120_000)
    page.wait_for_function("!document.querySelector('#tt-export').disabled", timeout=60_000)  # its recording
    page.wait_for_timeout(300)
    return status(page)


def test_one_picture_shows_one_pass_while_the_answer_streams(page):
    set_controls(page, "Tell me a long story about a fox and an owl.", 40)
    number(page, "tt-temperature", 0.8)  # a sampled draw (the page opens greedy)
    page.fill("#tt-seed input", "4")
    page.evaluate(PASSES)
    before = status(page)
    page.click("#tt-send")
    finish(page, before)
    mixed, seen, frames = page.evaluate("[window.__mixed, window.__passes, window.__frames]")
    assert frames > 30, frames
    assert not mixed, mixed  # a frame on screen with panels of two passes
    # every panel that shows the selected pass named it, the Speculation panel too
    assert set(seen) == {"tt-embedding", "tt-attention", "tt-kv", "tt-moe", "tt-sampling", "tt-spec",
                         "tt-logit-lens"}, seen


def test_a_replay_at_capture_level_off_counts_the_steps_its_timeline_has(page):
    page.check("#tt-level input[value=off]")
    set_controls(page, "Tell me a long story about a fox and an owl.", 16)
    number(page, "tt-temperature", 0.8)  # a sampled draw (the page opens greedy)
    page.fill("#tt-seed input", "4")  # a seeded draw with no early end-of-text: a replay of several steps
    before = status(page)
    page.click("#tt-send")
    final = finish(page, before)
    rid = final.split(":")[0]
    slider = "document.querySelector('#tt-step input[type=range]')"
    lo, hi = page.evaluate(f"[{slider}.min, {slider}.max].map(Number)")
    # the timeline's last redraw may land after Status says finished (heavy panels redraw at most every 0.45 s)
    page.wait_for_function("document.querySelector('#tt-timeline').innerText.includes('engine step')", timeout=90_000)
    timeline = page.inner_text("#tt-timeline")
    # it said "capture level off records no engine steps" beside a slider of 1..N engine steps
    assert "records no engine steps" not in timeline, timeline
    assert lo == 1 and f"drawn in {hi} engine steps" in timeline, (lo, hi, timeline)
    assert f"{hi} engine steps" in page.inner_text("#tt-step")
    page.locator("#tt-step input[type=range]").focus()
    page.keyboard.press("Home")
    said = wait_status(page, f"{rid}: step 1 of {hi} engine steps")
    assert "that drew a token" in said, said


def test_a_request_stopped_before_any_step_says_so_in_the_map_and_stages(server, page, monkeypatch):
    """A request that waited (another held the one sequence slot) and was stopped there: the
    Batching stage kept its "not reached yet" badge and Sampling said "no token sampled yet"."""
    body = {"model": server.service.model_name, "stream": True, "max_tokens": 100, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Hold the slot."}]}
    stop, held = threading.Event(), []

    def hold() -> None:  # another client's long answer, cut when the test is done
        with httpx.stream("POST", server.url + "v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                held.append((r.status_code, line[:80]))
                if stop.is_set():
                    break

    # the engine waits before its third step (the holder's 2 tokens drawn) until the Stop has
    # landed: on a busy machine the holder's 100 tokens could end first, and this one run
    gate = StepGate(at=(3,)).install(server.service.engine, monkeypatch)
    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert gate.reached() == 3  # the slot is taken
        set_controls(page, "I will wait.", 12)
        page.click("#tt-send")
        wait_status(page, ": ")  # its id: queued (or "streaming, 0 tokens": its panels drawn while it waits)
        page.click("#tt-stop")
        gate.release_all()
        said = wait_status(page, "finished")
        assert "finished (abort)" in said, (said, len(held))
        page.wait_for_timeout(800)
        assert said.endswith("0 tokens"), said
        for key in ("embedding", "layers", "sampling", "batching"):
            head = page.inner_text(f"#tt-stage-{key} .tt-stage-head h2")
            assert "not reached yet" not in head and "stopped before this stage" in head, (key, head)
        chips = page.evaluate("Object.fromEntries([...document.querySelectorAll('#tt-map .tt-map-chip')]"
                              ".map(c => [c.dataset.key, c.innerText]))")
        for key in ("embedding", "sampling", "batching"):
            assert "stopped before" in chips[key], chips
        assert "stopped before" not in chips["request"] and "stopped before" not in chips["tokens"], chips
        for panel in ("tt-sampling", "tt-embedding", "tt-logit-lens"):
            text = page.inner_text(f"#{panel}")
            assert "yet" not in text and "never reached" in text, (panel, text)
    finally:
        gate.release_all()
        stop.set()
        holder.join(timeout=60)


def test_stop_is_not_red_after_a_finish_on_a_first_load_at_420_px(server, browser):
    """Seen in two first-run 420 px screenshots: Stop bright red after a fast answer had finished.
    Gradio deleted its "secondary" from the browser's copy of the update when the next yield left
    it out, before a busy tab had applied it (app/page/updates.py); a slow phone is a throttled CPU."""
    context = browser.new_context(viewport={"width": 420, "height": 1000})
    try:
        page = open_page(context, server.url)
        context.new_cdp_session(page).send("Emulation.setCPUThrottlingRate", {"rate": 12})
        looks = []
        for level in ("off", "basic", "off", "basic"):
            page.check(f"#tt-level input[value={level}]")
            set_controls(page, "Name three colours.", 16)
            before = status(page)
            page.click("#tt-send")
            finish(page, before)
            page.wait_for_timeout(800)
            look = page.evaluate("""() => { const b = document.querySelector('#tt-stop');
              return {cls: b.className, bg: getComputedStyle(b).backgroundColor}; }""")
            r, g, b = (int(x) for x in re.findall(r"\d+", look["bg"])[:3])
            looks.append((level, "stop" in look["cls"].split() or (r > 180 and g < 120 and b < 120), look["bg"]))
        assert not any(red for _, red, _ in looks), looks  # red: the "stop" variant, after the answer ended
    finally:
        context.close()
