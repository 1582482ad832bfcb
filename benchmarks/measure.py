"""Measure whether the page keeps up with the engine (not a test: it prints figures).

    python -m benchmarks.measure [--requests 20] [--max-tokens 64] [--long-tokens 512] [app options: --model, ...]

Serves the app in this process, drives headless Chromium through N requests in one
tab, and prints (1) the lag from the engine producing each token (its trace event,
wall clock) to that token appearing in the page's DOM (a MutationObserver, same
clock), cut in three (engine -> the server's yield -> the server-sent message in the browser ->
on screen), and (2) how much Chromium's memory (PSS of all its processes) grew over the
N requests after one warm-up request, each against its target: every token on screen
within 0.5 s, and less than 300 MB of growth. Every part of the page that follows the engine is held to the same target
(FOLLOWERS): the timeline (each engine step counted in its "N engine steps" line), the map's
Stream chip ("N tokens"), the Stream stage's sentence, and the panels that name a forward pass
(Sampling's "selected: ... predicted X (position q)": the seven redraw together). Each line
gives the median, p95, p99 and max; the command exits 1 when any target fails. The model's end-of-text token is ignored
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
import math
import os
import re
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx

from app.__main__ import build_service, parse_args
from app.page import controller, live_view, stages, streaming
from benchmarks.browser import chromium_memory_mb, launch
from benchmarks.local_server import LocalServer

LAG_TARGET_MS = 500  # each token on screen within 0.5 s of the engine producing it
MEMORY_TARGET_MB = 300  # Chromium's growth over the requests

OBSERVER = """
// when each thing the page follows first showed each token / engine step of the request shown
// (window.__seen[follower]["request id:k"]); FOLLOWERS: follower -> [selector, regex, kind]: a chip
// titled "token k" marks every token up to k (the answer's text holds them; its chips are the newest
// MAX_TIMED only, and an update may bring more); a count N (tokens, steps) marks 1..N; a position q
// marks every position up to q (Python turns positions into token indices)
window.__seen = {};
window.__sse = [];
const FOLLOWERS = %s;
const top = {};  // follower:request id -> the highest k marked (a count or position marks from there)
function mark(box, at, rid, upto, from) {
  const now = Date.now(), t = at + ':' + rid;
  if (from < upto) [from, top[t]] = [Math.max(from, (top[t] ?? -1) + 1), Math.max(upto, top[t] ?? -1)];
  for (let k = from; k <= upto; k++) {
    const key = rid + ':' + k;
    if (!(key in box)) box[key] = now;
  }
}
new MutationObserver(() => {
  const code = document.querySelector('#tt-request code');
  if (!code) return;
  const rid = code.textContent;
  for (const [name, [sel, re, kind]] of Object.entries(FOLLOWERS)) {
    const box = window.__seen[name] || (window.__seen[name] = {});
    for (const el of document.querySelectorAll(sel)) {
      const m = new RegExp(re).exec(kind === 'chip' ? (el.getAttribute('title') || '') : el.textContent);
      if (!m) continue;
      if (kind === 'chip') mark(box, name, rid, +m[1], 0);
      else if (kind === 'count') mark(box, name, rid, +m[1], 1);
      else mark(box, name, rid, +m[1], 0);  // a position: every one up to it
    }
  }
}).observe(document, {subtree: true, childList: true, characterData: true});
window.__finished = {};
setInterval(() => {  // when the status first says a request finished
  const v = (document.querySelector('#tt-status textarea') || {}).value || '';
  const m = /^(\\S+): finished/.exec(v);
  if (m && !(m[1] in window.__finished)) window.__finished[m[1]] = Date.now();
}, 10);
const plainFetch = window.fetch;  // when each server-sent message carrying token chips arrived
window.fetch = async function (...args) {
  const r = await plainFetch.apply(this, args);
  const url = String((args[0] && args[0].url) || args[0]);
  if (!url.includes('queue/data') || !r.body) return r;
  const text = new TextDecoder();
  const tap = new TransformStream({transform(chunk, out) {
    const toks = [...text.decode(chunk, {stream: true}).matchAll(/title=\\\\"token (\\d+) /g)].map((m) => +m[1]);
    if (toks.length) window.__sse.push([Date.now(), toks]);
    out.enqueue(chunk);
  }});
  return new Response(r.body.pipeThrough(tap), {status: r.status, statusText: r.statusText, headers: r.headers});
};
"""
# what the page follows: the answer's token chips, the timeline's "N engine steps", the map's Stream
# chip ("N tokens"), the Stream stage's sentence ("... existed: N tokens so far"), and the panels that name a pass (their "selected: ... predicted X (position q)" line; all
# seven redraw together: Sampling stands for them)
FOLLOWERS = {
    "token": ["#tt-answer .tt-timed", r"^token (\d+)", "chip"],
    "timeline": ["#tt-timeline .tt-lines", r"(\d+) engine steps?", "count"],
    "map": [".tt-map-chip[data-key=answer] small", r"^(\d+) tokens?$", "count"],
    "stage": ["#tt-stage-text-answer", r"existed: (\d+) tokens?", "count"],
    "pass": ["#tt-sampling .tt-sel-pass", r"predicted .*?\(position (\d+)", "position"],
}
OBSERVER = OBSERVER % json.dumps(FOLLOWERS)


def run_request(page, prompt: str, timeout_s: float = 300) -> str:
    """Send one request and wait until its trace has ended -> its id. (Waiting for any new Status
    that says "finished" took the last request's end, after its lenses, for this one's.)"""
    before = page.input_value("#tt-status textarea").split(":")[0]
    page.fill("#tt-user textarea", prompt)
    page.click("#tt-send")
    page.wait_for_function("([old]) => { const v = document.querySelector('#tt-status textarea').value;"
                           " return v.split(':')[0] !== old && v.includes('finished') && !v.includes('computing'); }",
                           arg=[before], timeout=timeout_s * 1000)
    status = page.input_value("#tt-status textarea")
    page.wait_for_timeout(200)
    return status.split(":")[0]


def percentile(xs: list[float], q: float) -> float:
    """The q-th quantile of sorted xs, nearest rank (so p99 of 100 values is the 99th, not the max)."""
    return xs[min(len(xs) - 1, max(0, int(math.ceil(q * len(xs))) - 1))]


def lag_line(lags: list[float], missing: int, what: str = "token") -> str:
    """The lag figures and the verdict against LAG_TARGET_MS."""
    if not lags:
        return f"{what} lag: no {what} was seen on screen -> FAIL"
    lags = sorted(lags)
    ok = lags[-1] <= LAG_TARGET_MS and not missing
    return (f"{what} lag (engine -> on screen): median {statistics.median(lags):.0f} ms, p95 "
            f"{percentile(lags, 0.95):.0f} ms, p99 {percentile(lags, 0.99):.0f} ms, max {lags[-1]:.0f} ms; within "
            f"0.5 s: {sum(1 for x in lags if x <= LAG_TARGET_MS) / len(lags):.1%}; "
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


def follow_line(happened: dict[str, float], shown: dict[str, float], rids: list[str], what: str) -> str:
    """One follower's lag: each token (or engine step) of these requests until the page showed it."""
    keys = [k for k in happened if k.split(":")[0] in rids]
    return lag_line([shown[k] - happened[k] for k in keys if k in shown], sum(1 for k in keys if k not in shown), what)


# each follower (FOLLOWERS) -> what it follows, and its line's words
FOLLOWS = {"token": ("token", "answer: token"), "timeline": ("step", "timeline: engine step"),
           "map": ("token", "map (Stream chip): token"), "stage": ("token", "stage 'Stream' sentence: token"),
           "pass": ("token", "pass panels (Sampling's selected pass): token")}


def as_tokens(name: str, seen: dict[str, float], n_prompt: dict[str, int]) -> dict[str, float]:
    """A follower's marks keyed as the engine's events are ("request id:token index" or
    "request id:k-th step"): a token count N showed token N - 1, a predicted position q the
    token at index q - the prompt's tokens."""
    kind = FOLLOWERS[name][2]
    out = {}
    for key, t in seen.items():
        rid, k = key.rsplit(":", 1)
        if kind == "count" and FOLLOWS[name][0] == "token":
            out[f"{rid}:{int(k) - 1}"] = t
        elif kind == "position":
            if rid in n_prompt:
                out[f"{rid}:{int(k) - n_prompt[rid]}"] = t
        else:
            out[key] = t
    return out


def follow_lines(produced: dict, stepped: dict, seen: dict, n_prompt: dict, rids: list[str], who: str = "") -> list[str]:
    """Every follower's lag line for these requests."""
    lines = []
    for name, (kind, words) in FOLLOWS.items():
        shown = as_tokens(name, seen.get(name, {}), n_prompt)
        what = words.rsplit(": ", 1)[1]
        lines.append(f"{who}{words.rsplit(': ', 1)[0]} " + follow_line(produced if kind == "token" else stepped, shown,
                                                                       rids, what))
    return lines


def where_it_goes(produced: dict, yielded: dict, sse: list, seen: dict, rids: list[str]) -> str:
    """The answer's lag cut in three: engine -> the handler's yield carrying the token (server:
    the subscription queue, the stream loop, drawing), yield -> the server-sent message that
    carried it reached the browser (Gradio's queue, diff and SSE), message -> on screen (the
    browser applying the update)."""
    arrived: dict[int, list[float]] = {}
    for t, toks in sse:
        for k in toks:
            arrived.setdefault(k, []).append(t)
    parts: tuple[list[float], list[float], list[float]] = ([], [], [])
    for key, t0 in produced.items():
        if key.split(":")[0] not in rids or key not in yielded or key not in seen:
            continue
        t1 = yielded[key]
        t2 = next((t for t in sorted(arrived.get(int(key.rsplit(":", 1)[1]), ())) if t >= t1 - 5), None)
        parts[0].append(t1 - t0)
        if t2 is not None and t2 <= seen[key] + 5:
            parts[1].append(t2 - t1)
            parts[2].append(seen[key] - t2)

    def fig(xs: list[float]) -> str:
        xs = sorted(xs)
        return (f"median {statistics.median(xs):.0f}, p99 {percentile(xs, 0.99):.0f}, max {xs[-1]:.0f} ms"
                if xs else "n/a")
    return (f"where the answer's lag goes: engine -> server yield {fig(parts[0])}; yield -> message in the browser "
            f"{fig(parts[1])}; message -> on screen {fig(parts[2])} ({len(parts[0])} tokens)")


def record_yields(yielded: dict[str, float]) -> None:
    """Note when the page's stream first yielded each token's chip (the Controller's stream,
    wrapped in this process: the server's side of the lag)."""
    plain = controller.Controller.stream

    def stream(self, tab, *args, **kwargs):
        for out in plain(self, tab, *args, **kwargs):
            now, html = time.time() * 1000, out.get("answer")
            if isinstance(html, str):
                for m in re.finditer(r'title="token (\d+) ', html):
                    yielded.setdefault(f"{tab.view.request_id}:{m[1]}", now)
            yield out
    controller.Controller.stream = stream


def full_length(service) -> None:
    """Every answer as long as its max_tokens, the page's worst case: the model's end-of-text ids
    cleared in place, in the list the engine's sampler and its output processor (which ends a
    request) both read. (A new list reached the sampler alone: answers ended at their first end of
    text, 16 tokens of 64 on average and 28-92 of the long answer's 512.)"""
    service.engine.model_config.eos_token_ids.clear()


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


# the page's redraw periods --periods may set: name -> what it is
PERIODS = {"yield": "between updates sent (streaming.YIELD_EVERY)",
           "one_pass": "between the pass panels' redraws (live_view.ONE_PASS_EVERY)",
           "journey": "between the map's and the stages' redraws (stages.JOURNEY_EVERY)",
           "timeline": "between the timeline's redraws (live_view.HEAVY; 0: every update)"}


def set_periods(spec: str) -> dict[str, float]:
    """Set the page's redraw periods from "name=seconds,..." (before the page is built) -> every
    period as it now is."""
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, value = part.partition("=")
        if name not in PERIODS:
            raise SystemExit(f"--periods: unknown period {name!r} (one of {', '.join(PERIODS)})")
        seconds = float(value)
        if name == "yield":
            streaming.YIELD_EVERY = seconds
        elif name == "one_pass":
            live_view.ONE_PASS_EVERY = seconds
        elif name == "journey":
            stages.JOURNEY_EVERY = seconds
        elif seconds > 0:
            live_view.HEAVY["timeline"] = seconds
        else:
            live_view.HEAVY.pop("timeline", None)
    return {"yield": streaming.YIELD_EVERY, "one_pass": live_view.ONE_PASS_EVERY, "journey": stages.JOURNEY_EVERY,
            "timeline": live_view.HEAVY.get("timeline", 0.0)}


@dataclass
class EngineClock:
    """When each token exists, each step ends and each request ends, read off the engine's trace
    events (on the engine's thread) on the same wall clock as the page's."""
    produced: dict[str, float] = field(default_factory=dict)  # "request id:token index" -> when it existed
    stepped: dict[str, float] = field(default_factory=dict)  # "request id:k" -> when its k-th engine step ended
    step_counts: dict[str, int] = field(default_factory=dict)
    done: dict[str, float] = field(default_factory=dict)
    n_prompt: dict[str, int] = field(default_factory=dict)  # request id -> its prompt's tokens

    def on_event(self, ev) -> None:
        if ev.type == "token":
            self.produced[f"{ev.request_id}:{ev.data['index']}"] = time.time() * 1000
        elif ev.type == "schedule.step":
            for b in ev.data["batch"]:
                self.step_counts[b["request_id"]] = self.step_counts.get(b["request_id"], 0) + 1
                self.stepped[f"{b['request_id']}:{self.step_counts[b['request_id']]}"] = time.time() * 1000
        elif ev.type == "finish":
            self.done[ev.request_id] = time.time() * 1000
        elif ev.type == "tokenize":
            self.n_prompt[ev.request_id] = ev.data["count"]


def set_max_tokens(page, n: int) -> None:
    page.fill("#tt-max-tokens input[type=number]", str(n))
    page.press("#tt-max-tokens input[type=number]", "Enter")


def own_parser() -> argparse.ArgumentParser:
    """This tool's options (the app's follow them)."""
    own = argparse.ArgumentParser(prog="python -m benchmarks.measure", description=__doc__, add_help=False,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    own.add_argument("--requests", type=int, default=20)
    own.add_argument("--max-tokens", type=int, default=64)
    own.add_argument("--long-tokens", type=int, default=512, help="the long-answer run's tokens (0: skip it)")
    own.add_argument("--watch-tokens", type=int, default=64, help="the watched API request's tokens (0: skip it)")
    own.add_argument("--poll", choices=["metrics", "traces", "none"], default="traces",
                     help="what the other client polls during the long answer: /metrics, /metrics and the "
                          "request's trace (default), or nothing")
    own.add_argument("--periods", default="", metavar="NAME=S,...",
                     help="the page's redraw periods to try, in seconds (default: the page's own), e.g. "
                          "one_pass=0.45,journey=0.3,timeline=0.3 (the old page's): " + ", ".join(PERIODS))
    return own


def main(argv: list[str] | None = None) -> None:
    own = own_parser()
    ours, rest = own.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:  # this tool's options, then the app's (parse_args prints them)
        own.print_help()
        print("\nand the app's options:")
    args = parse_args(rest)
    from playwright.sync_api import sync_playwright

    periods = set_periods(ours.periods)
    service = build_service(args)
    full_length(service)
    clock = EngineClock()
    produced, stepped, done, n_prompt = clock.produced, clock.stepped, clock.done, clock.n_prompt
    yielded: dict[str, float] = {}  # "request id:token index" -> when the page's stream first yielded its chip
    record_yields(yielded)

    service.engine.tracer.add_sink(clock.on_event)
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
        sse = page.evaluate("window.__sse")
        finished_on_page = page.evaluate("window.__finished")
        browser.close()
    said: list[str] = []

    def say(text: str) -> None:
        print(text)
        said.append(text)

    chips = seen.get("token", {})
    worst = sorted(((chips[k] - produced[k], k) for k in produced if k.split(":")[0] in rids and k in chips),
                   reverse=True)[:5]
    tokens = sum(1 for k in produced if k.split(":")[0] in rids)
    say(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (other work shares them)")
    say("the page's redraw periods (s): " + ", ".join(f"{k} {v:g}" for k, v in periods.items()))
    say(f"requests: {len(rids)} in {elapsed:.1f} s, {tokens} tokens ({tokens / elapsed:.1f} tokens/s)")
    lines = follow_lines(produced, stepped, seen, n_prompt, rids)
    say(lines[0])
    say("slowest tokens (request:token index): " + ", ".join(f"{k} {lag:.0f} ms" for lag, k in worst))
    say(where_it_goes(produced, yielded, sse, chips, rids))
    say("\n".join(lines[1:]))
    if watched is not None:
        say("\n".join(follow_lines(produced, stepped, seen, n_prompt, [watched], f"watched API request {watched}: ")))
    growth_mb = (mem1 - mem0) * 1.048576  # MiB -> MB
    say(f"chromium memory (PSS): {mem0:.0f} MiB after warm-up -> {mem1:.0f} MiB after {len(rids)} requests: "
        f"growth {growth_mb:+.0f} MB -> target: under {MEMORY_TARGET_MB} MB: "
        f"{'PASS' if growth_mb < MEMORY_TARGET_MB else 'FAIL'}")
    if long_result is not None:
        rid, keys, calls = long_result
        late = finished_on_page.get(rid, float("nan")) - done.get(rid, float("nan"))
        polled = {"none": "no other client", "metrics": f"another client polling /metrics ({calls} polls)",
                  "traces": f"another client polling /metrics and /v1/traces/{{id}} ({calls} polls)"}[ours.poll]
        say(f"long answer: {len(keys)} tokens, {polled}; the page said 'finished' {late:.0f} ms after the engine "
            "finished")
        say("\n".join(follow_lines(produced, stepped, seen, n_prompt, [rid], "long answer ")))

    if any(line.endswith("FAIL") for text in said for line in text.splitlines()):
        sys.exit(1)  # a target failed (the figures above say which)


if __name__ == "__main__":
    main()
