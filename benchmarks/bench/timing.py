"""Timing: interleaved repeats and their medians, and running requests to completion."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams


def median_time(fn: Callable[[], object], repeats: int) -> float:
    return median_times([fn], repeats)[0]


def median_times(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median wall time of each fn, their runs interleaved so drift in the machine's
    speed hits them alike."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return [statistics.median(ts) for ts in times]


def repeat_spread(base: list[float], base1: list[float], ours: list[float], ours1: list[float]) -> str:
    """The ratio of each interleaved repeat on its own (decode time: a run's time minus
    the same repeat's one-token run), as "ratio over N interleaved repeats: lo-hi". A repeat
    whose one-token run took as long as its whole run (a stall on a busy machine) has no decode
    time to divide by: it is counted and named, not silently dropped."""
    ratios = sorted((b - b1) / (o - o1) for b, b1, o, o1 in zip(base, base1, ours, ours1) if o > o1)
    if not ratios:
        return ""
    total = min(len(base), len(base1), len(ours), len(ours1))
    if len(ratios) == total:
        return f"ratio over {total} interleaved repeats: {ratios[0]:.2f}-{ratios[-1]:.2f}"
    left = total - len(ratios)
    return (f"ratio over {len(ratios)} of {total} interleaved repeats: {ratios[0]:.2f}-{ratios[-1]:.2f} "
            f"({left} left out: its one-token run took as long as its whole run)")


def run_engine(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams],
               trace_level: str | None = None, speculative: bool = True) -> dict[str, dict]:
    """Run requests together to completion; per request: tokens, ttft."""
    ids = [engine.add_request(p, sp, trace_level=trace_level, speculative=speculative)
           for p, sp in zip(prompts, params)]
    while engine.has_unfinished_requests():
        engine.step()
    outs = {}
    for rid in ids:
        out = engine.get_output(rid)
        outs[rid] = {"tokens": out.token_ids, "ttft": out.metrics.get("ttft", 0.0)}
        engine.release(rid)
    return outs


def decode_seconds(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> float:
    """Wall time of the steps after every request's first token: the decode alone, timed
    directly rather than as a difference of two runs (which a tiny model's sub-millisecond
    decode on a busy machine can make negative)."""
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    waiting = set(ids)
    while waiting and engine.has_unfinished_requests():  # prefill, chunked or not
        waiting -= {o.request_id for o in engine.step()}
    t = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    elapsed = time.perf_counter() - t
    for rid in ids:
        engine.release(rid)
    return elapsed


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def decode_times(runs: dict[str, Callable[[int], object]], new_tokens: int, rounds: int) -> dict[str, list[float]]:
    """Wall times of each run generating `new_tokens` tokens (under its key) and 1 token
    (under key + "1"), every run interleaved with the others in each round so drift in the
    machine's speed hits them alike; a decode time is the one minus the other, which
    leaves the prefill out."""
    times: dict[str, list[float]] = {f"{k}{suffix}": [] for k in runs for suffix in ("", "1")}
    for _ in range(rounds):
        for key, fn in runs.items():
            for suffix, n in (("", new_tokens), ("1", 1)):
                t = time.perf_counter()
                fn(n)
                times[key + suffix].append(time.perf_counter() - t)
    return times


def decode_rate(times: dict[str, list[float]], key: str, tokens: int) -> float:
    """`tokens` (those after the first) over the median decode time of run `key`."""
    return tokens / (statistics.median(times[key]) - statistics.median(times[key + "1"]))
