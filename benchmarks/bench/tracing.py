"""What tracing costs: each trace level against no tracer, `off` step by step, full
tracing's cost a token against its bound, with the floor the exact logit lens sets, and
(tracing_watch.py) a `full` stream beside an untraced one, each capture's share, and
(tracing_page.py) the page's own request on a model served with a draft."""
from __future__ import annotations

import os
import random
import statistics
import time
from dataclasses import dataclass, replace

import torch

from benchmarks.bench.context import Bench
from benchmarks.bench.timing import greedy, run_engine, synchronize
from benchmarks.bench.tracing_page import page_request
from benchmarks.bench.tracing_watch import watch_cost
from engine.kernels import cpu as cpu_kernels
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.trace import EventList, Tracer


def tracing(b: Bench) -> None:
    """Each level against no tracer, on one engine (the same weights in memory, so only
    the tracing differs), runs interleaved so drift in the machine's speed hits every
    variant alike. Decode rate: the tokens after the first over the time after the
    first token; what a level adds before the first token shows in its TTFT row. The
    events are kept until the run ends, as a trace store keeps them. Two more variants
    draw with a sampled draw's knobs (temperature 0.8, top-p 0.95) instead of greedy:
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
    for _ in range(5 * s.repeats if s.repeats > 1 else 2):  # --quick (one repeat): two rounds, a median of two
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
    full_bound(b, engine, rates)
    watch_cost(b, engine, tracer, sink, n)
    page_request(b, n)


def full_bound(b: Bench, engine: LLMEngine, rates: dict[str, list[float]]) -> None:
    """Full tracing's cost a token against its bound, and the floor under it.

    The cost: per round, the full run's time a decode token less the untraced run's of the
    same round (the rounds interleave the variants, so a drift in the machine's speed
    cancels in each difference), the median over rounds; the lens's share likewise from
    `full, no logit lens`.

    The floor: the exact float32 logit lens sends L more rows through the LM head a token
    (the residual stream after the embedding and after every layer but the last), L x
    hidden x vocab multiply-adds, which no bookkeeping can remove: their count over the rate
    the LM head's own kernel reaches here (lens_floor) is the arithmetic floor in ms.

    The bound: that floor, plus the capture work (engine/trace/capture.py, the events):
    CAPTURE_BUDGET_MS a token plus CAPTURE_BUDGET_PER_LAYER_MS for each captured layer
    (its queries kept, its attention recomputed and encoded, its routing listed): see
    those constants for how they were chosen."""
    floor = lens_floor(engine)
    cfg = engine.model_config
    budget = CAPTURE_BUDGET_MS + CAPTURE_BUDGET_PER_LAYER_MS * cfg.num_layers
    bound = floor.ms + budget
    cost = _per_round_ms(rates["full"], rates["none"])
    lens = _per_round_ms(rates["full"], rates["full, no logit lens"])
    held = "holds" if cost <= bound else "EXCEEDED"
    b.add("tracing cost", "trace full: ms a token against its bound", cost, "ms", bound,
          f"{held}; bound = lens floor {floor.ms:.3f} + capture budget {budget:.2f} "
          f"({CAPTURE_BUDGET_MS} + {CAPTURE_BUDGET_PER_LAYER_MS} x {cfg.num_layers} layers); "
          f"median over {len(rates['none'])} interleaved rounds of full less no tracer; "
          f"load average {os.getloadavg()[0]:.1f}")
    b.add("tracing cost", "logit lens: ms a token against its float32 floor", lens, "ms", floor.ms,
          f"floor: {floor.macs / 1e6:.1f} M multiply-adds a token ({cfg.num_layers} rows x {cfg.hidden_size} "
          f"x {cfg.vocab_size}) at {floor.rate / 1e9:.1f} G/s, the LM head's rate at {floor.rows} rows here; "
          f"the lens's cost: full less full without the lens, per round")


def _per_round_ms(rates: list[float], base: list[float]) -> float:
    """The median over rounds of a variant's ms a token less the baseline's in the same round."""
    return statistics.median(1e3 * (1 / r - 1 / r0) for r, r0 in zip(rates, base))


# The capture work's budget a token over the lens floor (full_bound): a fixed part for what a traced
# token builds whatever the model (its sample, lens, embed, schedule and KV events, the pass's
# bookkeeping) and a part a layer (its queries kept, its attention scored and encoded, its routing
# listed). Chosen from this section's idle runs on the embedded MoE (4 layers) and SmolLM2 (30)
# of 2026-11-30 and 2026-12-01 (their figures: the bench's results files): the budget, 1.12 ms a
# token on the first and 1.9 ms on the second, covers both with a little room. On a loaded machine
# every figure of the section grows with the load and the row says EXCEEDED: its note carries the
# load average.
CAPTURE_BUDGET_MS = 1.0
CAPTURE_BUDGET_PER_LAYER_MS = 0.03


@dataclass
class LensFloor:
    ms: float  # the lens's multiply-adds a token at `rate`
    macs: int  # the lens's multiply-adds a token
    rate: float  # multiply-adds a second, measured
    rows: int  # the rows of the LM head calls that measured `rate`


def lens_floor(engine: LLMEngine, repeats: int = 20) -> LensFloor:
    """The exact float32 logit lens's arithmetic a token (see full_bound): its multiply-adds over
    the best rate the model's own LM head reaches here, the fastest of `repeats` calls at the
    lens's own row count (L + 1: its L rows and the model's) and at the most rows its kernel
    takes in one pass over the weight (the CPU kernel's MAX_ROWS), whichever is the faster rate:
    the weight's stream shared by many rows, so the figure is the arithmetic's."""
    model, cfg = engine.runner.model, engine.model_config
    dev = engine.device
    most = cpu_kernels.MAX_ROWS if dev.type == "cpu" else 256
    gen = torch.Generator().manual_seed(0)
    rate, rate_rows = 0.0, 0
    with torch.inference_mode():
        for rows in sorted({cfg.num_layers + 1, most}):
            x = torch.randn(rows, cfg.hidden_size, generator=gen).to(engine.runner.dtype).to(dev)
            best = float("inf")
            for i in range(repeats + 1):
                synchronize(dev.type)
                t = time.perf_counter()
                model.compute_logits(x)
                synchronize(dev.type)
                if i:  # the first call warms the caches
                    best = min(best, time.perf_counter() - t)
            if rows * cfg.hidden_size * cfg.vocab_size / best > rate:
                rate, rate_rows = rows * cfg.hidden_size * cfg.vocab_size / best, rows
    macs = cfg.num_layers * cfg.hidden_size * cfg.vocab_size
    return LensFloor(1e3 * macs / rate, macs, rate, rate_rows)


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
