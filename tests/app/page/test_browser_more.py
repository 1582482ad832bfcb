"""The page's extra sampling controls in a real Chromium (issue 26, part 6): one request with a
penalty and JSON mode sent from the page parses as JSON, and its sampling stage shows the
grammar's mask and the penalty's row; a click on a sampling candidate puts it in the logit-bias
control; n = 3 draws three choices side by side."""
from __future__ import annotations

import json

import pytest

from tests.app.page.test_more_controls import ONLY
from tests.browser_utils import number, open_page, server_fixture, set_controls, wait_finished, wait_status
from tests.holds import StepGate

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")]
ANSWER = "() => document.querySelector('#tt-answer .tt-answer').childNodes[0].textContent"


server = server_fixture(delay=0.03)


def test_json_mode_and_a_penalty_from_the_page(server, browser, shots):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = open_page(context, server.url)
    set_controls(page, "Give me JSON.", 24)
    number(page, "tt-temperature", 0)
    page.click("#tt-more > button")  # the accordion opens
    page.check("#tt-json-mode input[value='JSON schema']")
    page.fill("#tt-schema textarea", ONLY)
    number(page, "tt-repetition", 1.3)
    number(page, "tt-presence", 1)
    page.click("#tt-send")
    status = wait_finished(page)
    assert "finished (stop)" in status, status
    assert json.loads(page.evaluate(ANSWER)) == {"a": "x"}
    sampling = page.inner_text("#tt-sampling")
    assert "grammar mask" in sampling and "allowed 1 of" in sampling and "removed" in sampling
    assert "repetition penalty" in sampling and "presence penalty" in sampling
    assert page.locator("#tt-sampling [data-stage='repetition_penalty']").count() == 1
    assert "Speculation" in page.inner_text("#tt-map .tt-map-skipped")  # a grammar: no speculation, said at once
    page.locator("#tt-sampling").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "page_json_mode.png"), full_page=True)
    page.locator("#tt-stage-sampling").screenshot(path=str(shots / "page_json_mode_sampling.png"))
    page.locator("#tt-more").screenshot(path=str(shots / "page_more_controls.png"))
    # a click on a candidate biases it in the next request
    cell = page.locator("#tt-sampling td[data-bias-id]").nth(1)
    token = cell.get_attribute("data-bias-id")
    cell.click()
    page.wait_for_function(f"document.querySelector('#tt-bias-token input').value === '{token}'", timeout=90_000)
    assert page.input_value("#tt-bias input[type=number]") == "-100"
    assert f"id {token}" in page.inner_text("#tt-hint-more")
    context.close()


def three_choices(page, status: str) -> None:
    """The Choices panel draws three choices (failed once in CI after 'finished': say what it held)."""
    try:
        page.wait_for_function("document.querySelectorAll('#tt-choices .tt-choice').length === 3", timeout=90_000)
    except Exception as e:
        raise AssertionError(f"status {status!r}; Choices panel: {page.inner_html('#tt-choices')[:3000]!r}") from e


def test_n_choices_side_by_side(server, browser, shots):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = open_page(context, server.url)
    set_controls(page, "Tell me about foxes.", 8)
    number(page, "tt-temperature", 0.8)  # a sampled draw (the page opens greedy)
    page.fill("#tt-seed input", "2")
    page.click("#tt-more > button")
    number(page, "tt-n", 3)
    page.click("#tt-send")
    status = wait_finished(page)
    assert "finished" in status
    three_choices(page, status)
    texts = page.locator("#tt-choices .tt-choice-text").all_inner_texts()
    assert len(texts) == 3 and all(t and t != "…" for t in texts)
    assert page.locator("#tt-choices .tt-choice").nth(0).inner_text().count("finished") == 1
    boxes = [page.locator("#tt-choices .tt-choice").nth(i).bounding_box() for i in range(3)]
    assert boxes[0]["y"] == boxes[1]["y"] == boxes[2]["y"] and boxes[0]["x"] < boxes[1]["x"] < boxes[2]["x"]
    page.locator("#tt-choices").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "page_three_choices.png"), full_page=False)
    # replayed, the three choices stay side by side (not choice 0 alone): at step 1 none has finished,
    # at the last step the three texts are those streamed live
    page.wait_for_function("!document.querySelector('#tt-export').disabled", timeout=60_000)  # its recording
    last = int(page.input_value("#tt-step-box input"))
    number(page, "tt-step-box", 1)
    three_choices(page, wait_status(page, f"step 1 of {last} engine steps"))
    assert "finished" not in page.inner_text("#tt-choices"), page.inner_text("#tt-choices")
    number(page, "tt-step-box", last)
    three_choices(page, wait_status(page, f"step {last} of {last} engine steps"))
    assert page.locator("#tt-choices .tt-choice-text").all_inner_texts() == texts
    assert page.inner_text("#tt-choices").count("finished") == 3
    context.close()


def test_speculation_turned_off_is_skipped_in_the_map_while_the_request_streams(server, browser, monkeypatch):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = open_page(context, server.url)
    page.uncheck("#tt-speculative input")  # the model has a draft: this request runs without it
    set_controls(page, "Tell me about foxes.", 40)
    number(page, "tt-temperature", 0.8)  # a sampled draw (the page opens greedy)
    page.fill("#tt-seed input", "1")
    gate = StepGate(at=(6,)).install(server.service.engine, monkeypatch)  # 5 of the 40 tokens: still streaming
    try:
        page.click("#tt-send")
        assert gate.reached() == 6
        page.wait_for_function("document.querySelector('#tt-status textarea').value.includes('streaming')",
                               timeout=60_000)
        page.wait_for_selector("#tt-map .tt-map-skipped", timeout=60_000)
        skipped = page.inner_text("#tt-map .tt-map-skipped")
        still = page.input_value("#tt-status textarea")
        # its stage goes too, while held (a redraw's budget may draw it an update after the map)
        page.wait_for_selector("#tt-stage-spec", state="hidden", timeout=60_000)
    finally:
        gate.release_all()
    assert "streaming" in still and "Speculation" in skipped, (still, skipped)  # before the end, not after it
    wait_finished(page)
    assert not page.locator("#tt-stage-spec").is_visible(), "shown at the end"
    context.close()
