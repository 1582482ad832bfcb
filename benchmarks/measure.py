"""Measure whether the page keeps up with the engine (not a test: it prints figures).

    python -m benchmarks.measure [--requests 20] [--max-tokens 64] [--long-tokens 512] [app options: --model, ...]

Serves the app in this process, drives headless Chromium through N requests in one
tab, and prints (1) the lag from the engine producing each token (its trace event,
wall clock) to that token appearing in the page's DOM (a MutationObserver, same
clock), and (2) how much Chromium's memory (PSS of all its processes) grew over the
N requests after one warm-up request, each against its target: every token on screen
within 0.5 s, and less than 300 MB of growth. The timeline is held to the same target: each
engine step of a request counted in its "N engine steps" line within 0.5 s of the step. The model's end-of-text token is ignored
(as `ignore_eos` does), so every request streams --max-tokens tokens at full speed.

Then (3) watching: the page presses Watch and another client sends --watch-tokens tokens
through the API (as curl would); the same lag targets for the watched request's tokens and
its timeline (0: skip it).

Then (4) a long answer: one request of --long-tokens tokens (0: skip it) while another
client polls the server (GET /metrics and the request's GET /v1/traces/{id}, twice a
second), with the same lag target, and how long after the engine finished the page said
"finished". A page whose every update grows with the answer falls further behind with
each token; this run is where that shows.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import httpx

from app.__main__ import build_service, parse_args
from benchmarks.browser import chromium_memory_mb, launch
from benchmarks.local_server import LocalServer

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
new MutationObserver(() => {  // when the timeline first counted each engine step of the request shown
  const rid = document.querySelector('#tt-request code');
  const line = document.querySelector('#tt-timeline .tt-lines');
  if (!rid || !line) return;
  const m = /(\d+) engine steps?/.exec(line.textContent);
  const now = Date.now();
  for (let k = 1; m && k <= +m[1]; k++) {
    const key = rid.textContent + ':' + k;
    if (!(key in window.__steps)) window.__steps[key] = now;
  }
}).observe(document, {subtree: true, childList: true, characterData: true});
window.__steps = {};
window.__finished = {};
setInterval(() => {  // when the status first says a request finished
  const v = (document.querySelector('#tt-status textarea') || {}).value || '';
  const m = /^(\S+): finished/.exec(v);
  if (m && !(m[1] in window.__finished)) window.__finished[m[1]] = Date.now();
}, 10);
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


def lag_line(lags: list[float], missing: int, what: str = "token") -> str:
    """The lag figures and the verdict against LAG_TARGET_MS."""
    if not lags:
        return f"{what} lag: no {what} was seen on screen -> FAIL"
    lags = sorted(lags)
    p95 = lags[min(len(lags) - 1, int(0.95 * len(lags)))]
    ok = lags[-1] <= LAG_TARGET_MS and not missing
    return (f"{what} lag (engine -> on screen): median {statistics.median(lags):.0f} ms, p95 {p95:.0f} ms, "
            f"max {lags[-1]:.0f} ms; within 0.5 s: {sum(1 for x in lags if x <= LAG_TARGET_MS) / len(lags):.1%}; "
            f"{what}s never seen: {missing} -> target: every {what} within {LAG_TARGET_MS} ms: "
            f"{'PASS' if ok else 'FAIL'}")


class Poller:
    """Another client: GET /metrics and (traces=True) the running request's trace, every
    `every` seconds."""

    def __init__(self, url: str, every: float = 0.5, traces: bool = True) -> None:
        self.url, self.every, self.rid, self.traces = url, every, None, traces
        self.calls, self._stop = 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as http:
            while not self._stop.wait(self.every):
                http.get(self.url + "metrics")
                if self.rid and self.traces:
                    http.get(self.url + f"v1/traces/{self.rid}")
                self.calls += 1

    def __enter__(self) -> "Poller":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.thread.join(timeout=30)


def step_line(stepped: dict[str, float], seen: dict[str, float], rids: list[str]) -> str:
    """The timeline's lag: each engine step of these requests until the page counted it."""
    keys = [k for k in stepped if k.split(":")[0] in rids]
    return "timeline " + lag_line([seen[k] - stepped[k] for k in keys if k in seen],
                                  sum(1 for k in keys if k not in seen), "engine step")


def watch_request(page, url: str, model: str, max_tokens: int) -> str:
    """Press Watch, send one streamed API request from another client (as curl would), wait
    until the page says it finished -> its id."""
    page.click("#tt-watch")
    page.wait_for_function("document.querySelector('#tt-status textarea').value.includes('watching')",
                           timeout=60_000)
    body = {"model": model, "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Watched: tell me a story about a fox."}]}
    rid = None
    with httpx.Client(timeout=300) as http, http.stream("POST", url + "v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if rid is None and line.startswith("data: {"):
                rid = json.loads(line[6:])["id"]
    page.wait_for_function("([rid]) => document.querySelector('#tt-status textarea').value.includes(rid + ' finished')",
                           arg=[rid], timeout=120_000)
    page.click("#tt-stop")  # end the watching: Send again
    page.wait_for_timeout(500)
    print(f"  watched request: {rid}", file=sys.stderr, flush=True)
    return rid


def main(argv: list[str] | None = None) -> None:
    own = argparse.ArgumentParser(prog="python -m benchmarks.measure", description=__doc__, add_help=False,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    own.add_argument("--requests", type=int, default=20)
    own.add_argument("--max-tokens", type=int, default=64)
    own.add_argument("--long-tokens", type=int, default=512, help="the long-answer run's tokens (0: skip it)")
    own.add_argument("--watch-tokens", type=int, default=64, help="the watched API request's tokens (0: skip it)")
    own.add_argument("--poll", choices=["metrics", "traces", "none"], default="traces",
                     help="what the other client polls during the long answer: /metrics, /metrics and the "
                          "request's trace (default), or nothing")
    ours, rest = own.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:  # this tool's options, then the app's (parse_args prints them)
        own.print_help()
        print("\nand the app's options:")
    args = parse_args(rest)
    from playwright.sync_api import sync_playwright

    service = build_service(args)
    service.engine.model_config.eos_token_ids = []  # full-length answers: the page's worst case
    produced: dict[str, float] = {}
    stepped: dict[str, float] = {}  # "request id:k" -> when the request's k-th engine step ended
    step_counts: dict[str, int] = {}
    done: dict[str, float] = {}

    def on_event(ev) -> None:  # engine thread: when each token exists, each step ends, each request ends
        if ev.type == "token":
            produced[f"{ev.request_id}:{ev.data['index']}"] = time.time() * 1000
        elif ev.type == "schedule.step":
            for b in ev.data["batch"]:
                step_counts[b["request_id"]] = step_counts.get(b["request_id"], 0) + 1
                stepped[f"{b['request_id']}:{step_counts[b['request_id']]}"] = time.time() * 1000
        elif ev.type == "finish":
            done[ev.request_id] = time.time() * 1000

    def set_max_tokens(page, n: int) -> None:
        page.fill("#tt-max-tokens input[type=number]", str(n))
        page.press("#tt-max-tokens input[type=number]", "Enter")

    service.engine.tracer.add_sink(on_event)
    long_result = None
    with LocalServer(service) as server, sync_playwright() as pw:
        browser = launch(pw, extra_args=["--js-flags=--expose-gc"])  # collect garbage before each reading
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.add_init_script(OBSERVER)
        page.goto(server.url, wait_until="load")
        page.wait_for_selector("#tt-send")
        set_max_tokens(page, ours.max_tokens)
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
        watched = None
        if ours.watch_tokens > 0:
            watched = watch_request(page, server.url, service.model_name, ours.watch_tokens)
        if ours.long_tokens > 0:
            set_max_tokens(page, ours.long_tokens)
            page.wait_for_timeout(300)
            with Poller(server.url, every=0.5 if ours.poll != "none" else 3600, traces=ours.poll == "traces") as poller:
                before = set(produced)
                page.fill("#tt-user textarea", "A long one: tell me everything about foxes.")
                page.click("#tt-send")
                page.wait_for_function("document.querySelector('#tt-status textarea').value.includes('streaming')",
                                       timeout=120_000)
                poller.rid = page.input_value("#tt-status textarea").split(":")[0]
                page.wait_for_function("([rid]) => rid in window.__finished", arg=[poller.rid], timeout=600_000)
                page.wait_for_timeout(500)
            long_rid = poller.rid
            long_result = (long_rid, [k for k in produced if k not in before], poller.calls)
            print(f"  long request: {long_rid}", file=sys.stderr, flush=True)
        seen = page.evaluate("window.__seen")
        steps_seen = page.evaluate("window.__steps")
        finished_on_page = page.evaluate("window.__finished")
        browser.close()
    lags = [seen[k] - produced[k] for k in produced if k.split(":")[0] in rids and k in seen]
    worst = sorted(((seen[k] - produced[k], k) for k in produced if k.split(":")[0] in rids and k in seen),
                   reverse=True)[:5]
    missing = sum(1 for k in produced if k.split(":")[0] in rids and k not in seen)
    tokens = sum(1 for k in produced if k.split(":")[0] in rids)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (other work shares them)")
    print(f"requests: {len(rids)} in {elapsed:.1f} s, {tokens} tokens ({tokens / elapsed:.1f} tokens/s)")
    print(lag_line(lags, missing))
    print("slowest tokens (request:token index): " + ", ".join(f"{k} {lag:.0f} ms" for lag, k in worst))
    print(step_line(stepped, steps_seen, rids))
    if watched is not None:
        keys = [k for k in produced if k.split(":")[0] == watched]
        print(f"watched API request {watched}: " + lag_line([seen[k] - produced[k] for k in keys if k in seen],
                                                            sum(1 for k in keys if k not in seen)))
        print(f"watched API request {watched}: " + step_line(stepped, steps_seen, [watched]))
    growth_mb = (mem1 - mem0) * 1.048576  # MiB -> MB
    print(f"chromium memory (PSS): {mem0:.0f} MiB after warm-up -> {mem1:.0f} MiB after {len(rids)} requests: "
          f"growth {growth_mb:+.0f} MB -> target: under {MEMORY_TARGET_MB} MB: "
          f"{'PASS' if growth_mb < MEMORY_TARGET_MB else 'FAIL'}")
    if long_result is not None:
        rid, keys, calls = long_result
        lags = [seen[k] - produced[k] for k in keys if k in seen]
        missing = sum(1 for k in keys if k not in seen)
        late = finished_on_page.get(rid, float("nan")) - done.get(rid, float("nan"))
        polled = {"none": "no other client", "metrics": f"another client polling /metrics ({calls} polls)",
                  "traces": f"another client polling /metrics and /v1/traces/{{id}} ({calls} polls)"}[ours.poll]
        print(f"long answer: {len(keys)} tokens, {polled}; the page said 'finished' {late:.0f} ms after the engine "
              "finished")
        print("long answer " + lag_line(lags, missing))


if __name__ == "__main__":
    main()
