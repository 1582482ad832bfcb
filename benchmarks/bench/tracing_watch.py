"""Watching's cost as a learner sees it: a request traced `full` streamed beside the same
request untraced, at batch 1 and at the settings' batch, and each capture's share.

The stream rate: a request's tokens after its first over the time from its first token to
its last (the engine's token times), the rate the answer reaches its reader. A `full`
trace's logit lens is computed after the pass (engine/trace/lens_queue.py): in the page's
setting (CaptureConfig.lens_live_seconds, LIVE_LENS_S: the newest token's every 0.2 s, the
rest after the last token), every token's after its step (0: how it was), and all after the
last token (None). "Until the trace is done" counts the time to the last `finish` event too
(when an export holds every lens).

Each capture's cost a token: a variant without it against the one with it, in the same
round (variants interleaved, a new order each round), the median over rounds: the logit
lens, then attention, then the embedding rows; what stays at `full` beyond `basic` is the
MoE routing (and the pass's capture bookkeeping); `basic` against none is the events
every traced step builds (schedule, KV fills, sampling, kv.pool).

The same costs by the engine's own clock (TraceCosts: the tracing work of each
kind, timed where it runs on the engine's thread, the page's variant's seconds over its
tokens, the median over rounds): what the toggles cannot split (schedule, KV fills,
sampling, kv.pool), and the lens with its live and after-the-answer parts together. Work
inside the pass (keeping the captured rows and the routing) is the toggles' only.

`python -m benchmarks.bench --sections watching` runs these rows alone."""
from __future__ import annotations

import os
import random
import statistics
import time
from dataclasses import replace

from benchmarks.bench.context import Bench
from benchmarks.bench.timing import greedy
from engine.llm_engine import LLMEngine
from engine.trace import EventList, Tracer
from engine.trace.costs import KINDS
from engine.trace.tracer import LIVE_LENS_S

LIVE = f"full (the page's: the newest lens every {LIVE_LENS_S:g} s)"
EVERY = "full, every token's lens after its step"
AT_END = "full, lens after the last token"


def watching(b: Bench) -> None:
    """The plain-decode watching rows (tracing_page.py's watching adds the page's request)."""
    sink = EventList()
    tracer = Tracer(sink)
    watch_cost(b, LLMEngine(b.model, device=b.device, tracer=tracer), tracer, sink, 2 * b.settings.new_tokens)


def watch_cost(b: Bench, engine: LLMEngine, tracer: Tracer, sink: EventList, n: int) -> None:
    base = replace(engine.capture, lens_live_seconds=None)
    variants = {"untraced": (None, base), LIVE: ("full", replace(base, lens_live_seconds=LIVE_LENS_S)),
                EVERY: ("full", replace(base, lens_live_seconds=0.0)), AT_END: ("full", base),
                "full, no lens": ("full", replace(base, logit_lens_top=0)),
                "full, no lens, attention": ("full", replace(base, logit_lens_top=0, attention_layers=[])),
                "full, no lens, attention, embedding rows":
                    ("full", replace(base, logit_lens_top=0, attention_layers=[], embed_dims=0)),
                "basic": ("basic", base)}
    for batch in sorted({1, b.settings.batch}):
        stream, done, clock = rounds(b, engine, tracer, sink, variants, batch, n)
        s0 = statistics.median(stream["untraced"])
        load = os.getloadavg()[0]
        for name in (LIVE, EVERY, AT_END, "full, no lens"):
            r = statistics.median(stream[name])
            paired = statistics.median(v / u for v, u in zip(stream[name], stream["untraced"]))
            b.add("tracing cost", f"watching, batch {batch}, {name}: stream tok/s", r, "tok/s", s0,
                  f"first to last token, ratio {r / s0:.3f} against untraced ({paired:.3f} round by round); until the "
                  f"trace is done {statistics.median(done[name]) / statistics.median(done['untraced']):.3f}; "
                  f"load average {load:.1f}")
        # each round's traced rate over its own untraced one: a machine whose speed drifts between rounds
        # (a shared host's) moves both alike (medians of each apart differed by up to 0.1 on one evening)
        b.add("tracing cost", f"watching, batch {batch}, {LIVE}: stream ratio, round by round",
              statistics.median(v / u for v, u in zip(stream[LIVE], stream["untraced"])), "x", None,
              f"the median over {len(stream[LIVE])} rounds of the round's traced over untraced stream rate")
        steps = [(AT_END, "full, no lens", "logit lens"), ("full, no lens", "full, no lens, attention", "attention"),
                 ("full, no lens, attention", "full, no lens, attention, embedding rows", "embedding rows"),
                 ("full, no lens, attention, embedding rows", "basic", "MoE routing and the pass's bookkeeping"),
                 ("basic", "untraced", "schedule, KV fills, sampling, kv.pool events")]
        for with_it, without, what in steps:
            ms = statistics.median(1e3 * (1 / a - 1 / c) for a, c in zip(done[with_it], done[without]))
            b.add("tracing cost", f"watching, batch {batch}, {what}: ms a token", ms, "ms", None,
                  f"{with_it} less {without}, per round, until the trace is done")
        for kind in KINDS:
            ms = statistics.median(r[kind] for r in clock[LIVE])
            if ms > 0:
                b.add("tracing cost", f"watching, batch {batch}, {kind}, by the engine's clock: ms a token", ms,
                      "ms", None, f"{LIVE}: its {kind} work on the engine's thread over its tokens, median of rounds")


def rounds(b: Bench, engine: LLMEngine, tracer: Tracer, sink: EventList, variants: dict, batch: int,
            n: int) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[dict[str, float]]]]:
    """Per variant, per round: the median request's stream rate, the batch's tokens after the
    first over the time after the first token to the last request's end (its finish included),
    and the engine's clock of each kind of tracing work (ms a token)."""
    stream = {k: [] for k in variants}
    done = {k: [] for k in variants}
    clock = {k: [] for k in variants}
    pool = engine.lane.pool_trace
    order = random.Random(batch)
    prompts = b.prompts[:batch]
    for _ in range(max(2, 2 * b.settings.repeats)):
        for name in order.sample(list(variants), len(variants)):
            level, engine.capture = variants[name]
            engine.tracer = None if level is None else tracer
            engine.step_trace.costs.take()
            pool.seconds = 0.0
            t = time.perf_counter()
            ids = [engine.add_request(p, greedy(n), trace_level=level) for p in prompts]
            while engine.has_unfinished_requests():
                engine.step()
            elapsed = time.perf_counter() - t
            spent = engine.step_trace.costs.take() | {"kv.pool": pool.seconds}
            clock[name].append({k: 1e3 * v / (batch * n) for k, v in spent.items()})
            metrics = [engine.get_output(r).metrics for r in ids]
            for r in ids:
                engine.release(r)
            sink.events.clear()
            lat = [m["token_latencies"] for m in metrics]
            stream[name].append(statistics.median(len(x) / max(sum(x), 1e-9) for x in lat))
            done[name].append(batch * (n - 1) / max(elapsed - max(m["ttft"] for m in metrics), 1e-9))
    engine.tracer, engine.capture = tracer, replace(engine.capture, lens_live_seconds=LIVE_LENS_S)
    return stream, done, clock
