"""What a batch-1 decode step costs outside its C calls: the Python and PyTorch work around the
layers and the LM head (scheduling, the batch's tensors, sampling, the token's bookkeeping).

On a model as small as the embedded MoE the C calls are a few hundred microseconds a token, so
this work is a large share of a step; llama.cpp, all C++, pays far less of it. Counted exactly
(function calls seen by the profiler hook, Python and C) and timed (each step's wall time and
the time inside the C calls that run the layers and the LM head, medians over the steps)."""
from __future__ import annotations

import statistics
import sys
import time

from benchmarks.bench.context import Bench
from benchmarks.bench.timing import greedy, run_engine
from engine.kernels import cpu as cpu_kernels

C_CALLS = ("tt_decode_stack", "tt_linear_f32", "tt_linear_bf16", "tt_linear_f16")  # layers, LM head


def step_overhead(b: Bench) -> None:
    if b.cuda or not cpu_kernels.available():
        return
    engine = b.engine()
    prompt, n = b.prompts[0], 2 * b.settings.new_tokens
    run_engine(engine, [prompt], [greedy(8)])  # warm-up
    calls = count_calls(engine, prompt, n)
    step, inside = time_steps(engine, prompt, n, 3 * b.settings.repeats)
    section = "decode step outside the C calls (batch 1)"
    b.add(section, "Python function calls a step", calls["call"], "calls", None,
          f"and {calls['c_call']} calls into C (PyTorch ops, ctypes, builtins); {n - 1} decode steps")
    b.add(section, "time outside the layers' and LM head's C calls", step - inside, "us", step,
          f"baseline: the whole step ({step:.0f} us, medians over steps); inside those calls {inside:.0f} us")


def count_calls(engine, prompt: list[int], n: int) -> dict[str, float]:
    """Profiler events per decode step ('call': Python functions, 'c_call': calls into C)."""
    rid = engine.add_request(prompt, greedy(n))
    engine.step()  # the prefill, not counted
    counts = {"call": 0, "c_call": 0}

    def hook(frame, event, arg):
        if event in counts:
            counts[event] += 1
    steps = 0
    sys.setprofile(hook)
    try:
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
    finally:
        sys.setprofile(None)
        engine.release(rid)
    return {k: round(v / steps) for k, v in counts.items()}


def time_steps(engine, prompt: list[int], n: int, rounds: int) -> tuple[float, float]:
    """Median decode step and median time inside C_CALLS a step, in microseconds."""
    lib = cpu_kernels.library()
    inside: list[float] = []
    real = {name: getattr(lib, name) for name in C_CALLS}

    def timed(fn):
        def call(*args):
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                inside[-1] += time.perf_counter() - t
        return call
    steps: list[float] = []
    per_step: list[float] = []
    for name, fn in real.items():
        setattr(lib, name, timed(fn))
    try:
        for _ in range(rounds):
            rid = engine.add_request(prompt, greedy(n))
            inside.append(0.0)
            engine.step()  # the prefill, not timed
            while engine.has_unfinished_requests():
                inside.append(0.0)
                t = time.perf_counter()
                engine.step()
                steps.append(time.perf_counter() - t)
                per_step.append(inside[-1])
            engine.release(rid)
    finally:
        for name, fn in real.items():
            setattr(lib, name, fn)
    return 1e6 * statistics.median(steps), 1e6 * statistics.median(per_step)
