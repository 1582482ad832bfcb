"""The prefix-cache stage's «Send the second request» in a real Chromium: after a request
finishes, the button sends the follow-up its stage promised, from this page (the prompt box
shows it), and that request's own prefix-cache stage reads a HIT."""
from __future__ import annotations

import pytest

from tests.browser_utils import open_page, server_fixture, set_controls, wait_finished

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")]

server = server_fixture(delay=0.0)
STATUS = "document.querySelector('#tt-status textarea').value"


def test_the_second_request_is_sent_from_the_page_and_hits(server, browser):
    page = open_page(browser.new_context(viewport={"width": 1400, "height": 1000}), server.url)
    set_controls(page, "What is the capital of France?", 8, system="You are a helpful assistant.")
    page.click("#tt-send")
    first = wait_finished(page).split(":")[0]
    assert "MISS" in page.inner_text("#tt-prefix")
    page.click("#tt-second-request")
    page.wait_for_function(f"([old]) => !{STATUS}.startsWith(old) && {STATUS}.includes('finished')", arg=[first],
                           timeout=120_000)
    assert page.input_value("#tt-user textarea").startswith("What is the capital of France?")
    assert page.input_value("#tt-user textarea") != "What is the capital of France?"  # the follow-up, typed in
    assert "HIT" in page.inner_text("#tt-prefix")
    assert server.service.engine.lane.block_manager.num_cached_blocks >= 1
