"""Measure whether the page keeps up with the engine (not a test: it prints figures).

    python -m app.measure [--requests 20] [--max-tokens 64] [app options: --model, --draft, ...]

Serves the app in this process, drives headless Chromium through N requests in one
tab, and prints (1) the lag from the engine producing each token (its trace event,
wall clock) to that token appearing in the page's DOM (a MutationObserver, same
clock), and (2) how much Chromium's memory (PSS of all its processes) grew over the
N requests after one warm-up request, each against its target: every token on screen
within 0.5 s, and less than 300 MB of growth. The model's end-of-text token is ignored
(as `ignore_eos` does), so every request streams --max-tokens tokens at full speed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from app.__main__ import build_service, parse_args
from app.browser import chromium_memory_mb, launch
from app.local_server import LocalServer

LAG_TARGET_MS = 500  # each token on screen within 0.5 s of the engine producing it
MEMORY_TARGET_MB = 300  # Chromium's growth over the requests

OBSERVER = """
window.__seen = {};
new MutationObserver(() => {
  const rid = document.querySelector('#tt-request code');
  if (!rid) return;
  const now = Date.now();
  for (const chip of document.querySelectorAll('#tt-answer .tt-timed')) {
    const m = /^token (\\d+)/.exec(chip.getAttribute('title') || '');
    const key = rid.textContent + ':' + (m ? m[1] : '?');
    if (!(key in window.__seen)) window.__seen[key] = now;
  }
}).observe(document, {subtree: true, childList: true, characterData: true});
"""


def run_request(page, prompt: str, timeout_s: float = 300) -> str:
    before = page.input_value("#tt-status textarea")
    page.fill("#tt-user textarea", prompt)
    page.click("#tt-send")
    page.wait_for_function("([old]) => { const v = document.querySelector('#tt-status textarea').value;"
                           " return v !== old && v.includes('finished'); }", arg=[before], timeout=timeout_s * 1000)
    status = page.input_value("#tt-status textarea")
    page.wait_for_timeout(200)
    return status.split(":")[0]


def main(argv: list[str] | None = None) -> None:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--requests", type=int, default=20)
    own.add_argument("--max-tokens", type=int, default=64)
    ours, rest = own.parse_known_args(argv)
    args = parse_args(rest)
    from playwright.sync_api import sync_playwright

    service = build_service(args)
    service.engine.model_config.eos_token_ids = []  # full-length answers: the page's worst case
    produced: dict[str, float] = {}

    def on_event(ev) -> None:  # engine thread: when each token exists
        if ev.type == "token":
            produced[f"{ev.request_id}:{ev.data['index']}"] = time.time() * 1000

    service.engine.tracer.add_sink(on_event)
    with LocalServer(service) as server, sync_playwright() as pw:
        browser = launch(pw, extra_args=["--js-flags=--expose-gc"])  # collect garbage before each reading
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.add_init_script(OBSERVER)
        page.goto(server.url, wait_until="load")
        page.wait_for_selector("#tt-send")
        page.fill("#tt-max-tokens input[type=number]", str(ours.max_tokens))
        page.press("#tt-max-tokens input[type=number]", "Enter")
        run_request(page, "Warm-up: say hello.")
        page.wait_for_timeout(1000)
        page.evaluate("window.gc()")
        mem0 = chromium_memory_mb()
        rids = []
        t0 = time.perf_counter()
        for i in range(ours.requests):
            rids.append(run_request(page, f"Request {i + 1}: tell me a short story about a fox."))
            print(f"  request {i + 1}/{ours.requests}: {rids[-1]}", file=sys.stderr, flush=True)
        elapsed = time.perf_counter() - t0
        page.wait_for_timeout(1000)
        page.evaluate("window.gc()")
        mem1 = chromium_memory_mb()
        seen = page.evaluate("window.__seen")
        browser.close()
    lags = [seen[k] - produced[k] for k in produced if k.split(":")[0] in rids and k in seen]
    missing = sum(1 for k in produced if k.split(":")[0] in rids and k not in seen)
    tokens = sum(1 for k in produced if k.split(":")[0] in rids)
    lags.sort()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (other work shares them)")
    print(f"requests: {len(rids)} in {elapsed:.1f} s, {tokens} tokens ({tokens / elapsed:.1f} tokens/s)")
    if lags:
        p95 = lags[min(len(lags) - 1, int(0.95 * len(lags)))]
        ok = lags[-1] <= LAG_TARGET_MS and not missing
        print(f"token lag (engine -> on screen): median {statistics.median(lags):.0f} ms, p95 {p95:.0f} ms, "
              f"max {lags[-1]:.0f} ms; within 0.5 s: {sum(1 for x in lags if x <= LAG_TARGET_MS) / len(lags):.1%}; "
              f"tokens never seen: {missing} -> target: every token within {LAG_TARGET_MS} ms: "
              f"{'PASS' if ok else 'FAIL'}")
    else:
        print("token lag: no token was seen on screen -> FAIL")
    growth_mb = (mem1 - mem0) * 1.048576  # MiB -> MB
    print(f"chromium memory (PSS): {mem0:.0f} MiB after warm-up -> {mem1:.0f} MiB after {len(rids)} requests: "
          f"growth {growth_mb:+.0f} MB -> target: under {MEMORY_TARGET_MB} MB: "
          f"{'PASS' if growth_mb < MEMORY_TARGET_MB else 'FAIL'}")


if __name__ == "__main__":
    main()
