"""The page's Library tab in a real Chromium: the traces the database keeps are listed (their
prompts as text, never as HTML), searched, opened in the Journey tab to replay, pinned and
deleted."""
from __future__ import annotations

import httpx
import pytest

from app.server import create_app
from app.store.opening import open_library
from benchmarks.local_server import LocalServer
from tests.browser_utils import open_page, wait_status
from tests.service_utils import app_service

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("library")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADIO_TEMP_DIR", str(tmp))
        svc = app_service(checkpoint, "--draft", "none", model="llama")
        library = open_library(svc.store, str(tmp / "traces.db"), lambda line: None)
        with LocalServer(svc, app=create_app(svc, library=library)) as srv:
            for words in ("Why is the <b>sky</b> blue?", "Tell me about cats"):
                r = httpx.post(srv.url + "v1/chat/completions", timeout=60, json={
                    "messages": [{"role": "user", "content": words}], "max_tokens": 5, "trace_level": "full"})
                assert r.status_code == 200
            assert library.writer.flush(20)
            srv.library = library
            yield srv
        library.close()


def _listed(page) -> list[str]:
    page.click("#tt-lib-pick input")
    page.wait_for_selector("ul[role=listbox] li")
    names = [n.split("\n")[-1] for n in page.locator("ul[role=listbox] li").all_inner_texts()]  # less the ✓ of the pick
    page.keyboard.press("Escape")
    return names


def test_the_library_lists_searches_opens_pins_and_deletes(server, browser, shots):
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    page = open_page(context, server.url)
    page.click("#tt-tab-library-button, button[role=tab]:has-text('Library')")
    # the tab's select refreshes the list the page was built with (before these two were sent)
    page.wait_for_function("document.querySelector('#tt-lib-note').innerText.includes('2 traces')")
    assert "last across restarts" in page.inner_text("#tt-lib-note")
    names = _listed(page)
    assert len(names) == 2 and "Tell me about cats" in names[0] and "Why is the <b>sky</b> blue?" in names[1]
    page.fill("#tt-lib-search textarea, #tt-lib-search input", "SKY")
    page.press("#tt-lib-search textarea, #tt-lib-search input", "Enter")
    page.wait_for_function("document.querySelector('#tt-lib-note').innerText.includes('whose prompt holds')")
    assert [n for n in _listed(page)] == [names[1]]
    page.screenshot(path=str(shots / "library.png"))
    page.click("#tt-lib-pin")
    page.wait_for_function("document.querySelector('#tt-lib-said').innerText.startsWith('pinned')")
    rid = page.inner_text("#tt-lib-said").split()[-1]
    assert server.library.repo.meta(rid).pinned
    page.click("#tt-lib-open")
    wait_status(page, "loaded")  # the Journey tab, on the stored trace
    assert page.is_visible("#tt-tab-journey") and "sky" in page.inner_text("#tt-request")
    page.screenshot(path=str(shots / "library-opened.png"))
    page.click("#tt-tab-library-button, button[role=tab]:has-text('Library')")
    page.click("#tt-lib-delete")
    page.wait_for_function("document.querySelector('#tt-lib-said').innerText.startsWith('deleted')")
    assert server.library.repo.meta(rid) is None
    context.close()
