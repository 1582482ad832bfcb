"""What a page load weighs: the bytes of the two documents that carry the page's components
(GET / and GET /config) and of every response a real Chromium fetches while the page opens
(its scripts and styles too), and, after a stage's code view is opened, what that view
fetched (GET /code/{key}).

    python -m benchmarks.page_weight [the app's options, e.g. --model smollm2]

With no options it serves the embedded model. Numbers in docs/page.md ("The code that ran it")."""
from __future__ import annotations

import os
import sys
import tempfile

import httpx
from playwright.sync_api import sync_playwright

import benchmarks.browser
from app.__main__ import build_services, parse_args
from benchmarks.local_server import LocalServer


def _bodies(responses) -> int:
    total = 0
    for r in responses:
        try:
            total += len(r.body())
        except Exception:  # noqa: BLE001 - a streamed response (the queue) has no body to count
            pass
    return total


def measure(url: str) -> dict:
    docs = {p or "/": len(httpx.get(url + p, timeout=120).content) for p in ("", "config")}
    with sync_playwright() as pw:
        browser = benchmarks.browser.launch(pw)
        page = browser.new_page()
        seen = []
        page.on("response", lambda r: seen.append(r))
        page.goto(url, wait_until="load")
        page.wait_for_selector("#tt-send")
        page.wait_for_timeout(2000)
        load = (len(seen), _bodies(seen))
        seen.clear()
        page.locator("#tt-code-prefix summary").click()
        page.locator("#tt-code-prefix .tt-code-src").first.wait_for(state="visible")
        opened = _bodies(seen)
        browser.close()
    return {**docs, "responses": load[0], "load_bytes": load[1], "prefix_view_bytes": opened}


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("GRADIO_TEMP_DIR", tempfile.mkdtemp())
    with LocalServer(build_services(parse_args(argv if argv is not None else sys.argv[1:]))) as server:
        got = measure(server.url)
    print(f"GET / {got['/']:,} B · GET /config {got['config']:,} B · the load in Chromium: {got['responses']} "
          f"responses, {got['load_bytes']:,} B · the prefix stage's code view opened: {got['prefix_view_bytes']:,} B")


if __name__ == "__main__":
    main()
