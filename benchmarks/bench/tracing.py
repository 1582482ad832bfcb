"""What tracing costs: each trace level against no tracer, and `off` step by step."""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import replace

from benchmarks.bench.context import Bench
from benchmarks.bench.timing import greedy, run_engine
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.trace import EventList, Tracer


def tracing(b: Bench) -> None:
    """Each level against no tracer, on one engine (the same weights in memory, so only
    the tracing differs), runs interleaved so drift in the machine's speed hits every
    variant alike. Decode rate: the tokens after the first over the time after the
    first token; what a level adds before the first token shows in its TTFT row. The
    events are kept until the run ends, as a trace store keeps them. Two more variants
    draw with the page's default knobs (temperature 0.8, top-p 0.95) instead of greedy:
    without a tracer, and traced `full` as the page traces (seeded, so every run draws
    the same tokens)."""
    s = b.settings
    n = 2 * s.new_tokens  # longer runs: the differences measured here are small
    prompts = b.prompts[:1]
    sampled = SamplingParams(temperature=0.8, top_p=0.95, seed=0, max_tokens=n, ignore_eos=True)
    sink = EventList()
    tracer = Tracer(sink)
    engine = LLMEngine(b.model, device=b.device, tracer=tracer)
    lens_on, lens_off = engine.capture, replace(engine.capture, logit_lens_top=0)
    # name -> trace level (None: the engine as built without a tracer), capture, sampling
    variants = {"none": (None, lens_on, greedy(n)), "off": ("off", lens_on, greedy(n)),
                "basic": ("basic", lens_on, greedy(n)), "full": ("full", lens_on, greedy(n)),
                "full, no logit lens": ("full", lens_off, greedy(n)),  # what the lens costs
                "sampled, no tracer": (None, lens_on, sampled), "sampled, full": ("full", lens_on, sampled)}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    ttfts: dict[str, list[float]] = {name: [] for name in variants}
    order = random.Random(0)
    for _ in range(5 * s.repeats):
        # a new order each round: a run must not always follow the same variant (the one
        # after `full` inherits the freeing of its events)
        for name in order.sample(list(variants), len(variants)):
            level, engine.capture, params = variants[name]
            engine.tracer = None if level is None else tracer
            t = time.perf_counter()
            out = next(iter(run_engine(engine, prompts, [params], trace_level=level).values()))
            elapsed = time.perf_counter() - t
            rates[name].append((n - 1) / (elapsed - out["ttft"]))
            ttfts[name].append(out["ttft"])
            sink.events.clear()
    engine.tracer, engine.capture = tracer, lens_on
    tracing_off_steps(b, engine, tracer, prompts[0], n)
    rate0, ttft0 = statistics.median(rates["none"]), statistics.median(ttfts["none"])
    for name in list(variants)[1:]:
        rate = statistics.median(rates[name])
        what = (f"decode with temperature 0.8 + top-p 0.95, {name.split(', ')[1]}" if name.startswith("sampled")
                else f"trace {name}")
        b.add("tracing cost", f"{what}: tok/s", rate, "tok/s", rate0,
              f"decode; baseline: greedy, no tracer; {1e3 * (1 / rate - 1 / rate0):+.2f} ms a token")
        if not name.startswith("sampled"):
            b.add("tracing cost", f"{what}: TTFT", statistics.median(ttfts[name]) * 1e3, "ms", ttft0 * 1e3)


def tracing_off_steps(b: Bench, engine: LLMEngine, tracer: Tracer, prompt: list[int], n: int) -> None:
    """`off` against no tracer, step by step: one request's decode steps alternate
    between the two, so even slow drift in the machine's speed cancels, and the many
    steps give a confidence interval for a difference of a few percent."""
    steps: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(4 * b.settings.repeats):
        engine.tracer = tracer
        rid = engine.add_request(prompt, greedy(n), trace_level="off")
        engine.step()  # the prefill
        with_tracer = False
        while engine.has_unfinished_requests():
            engine.tracer = tracer if with_tracer else None
            t = time.perf_counter()
            engine.step()
            steps[with_tracer].append(time.perf_counter() - t)
            with_tracer = not with_tracer
        engine.release(rid)
    engine.tracer = tracer
    off, none = steps[True], steps[False]
    rng = random.Random(0)
    ratios = sorted(statistics.median(rng.choices(none, k=len(none))) /
                    statistics.median(rng.choices(off, k=len(off))) for _ in range(1000))
    b.add("tracing cost", "trace off, alternate steps: tok/s", 1 / statistics.median(off), "tok/s",
          1 / statistics.median(none), f"{len(off) + len(none)} decode steps; ratio 95% CI "
          f"{ratios[25]:.3f}-{ratios[974]:.3f}")
