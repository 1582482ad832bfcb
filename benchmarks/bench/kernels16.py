"""One SmolLM2-135M decode step's matrices (qkv, o, gate_up, down x 30, the LM head) through the C
linear kernels at float32, bfloat16 and float16, 1 and 8 rows, on one thread, timed by the
thread's CPU time: a machine shared with other work slows the wall clock of every variant
unevenly (a 2-thread OpenMP call waits for a descheduled partner), its CPU time far less. Each
matrix its own memory, so a pass streams them from DRAM as a decode step does; the dtypes'
passes interleaved, the minimum over repeats. The ratio to float32 is what the 16-bit weights
buy in the matrices alone, before the rest of a step."""
from __future__ import annotations

import time

import torch

from benchmarks.bench.context import Bench
from engine.kernels import cpu as cpu_kernels

# SmolLM2-135M: hidden 576, 9 query / 3 KV heads of 64, MLP 1536, vocabulary 49152, 30 layers
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def kernels16(b: Bench) -> None:
    if b.cuda or not cpu_kernels.available():
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        shapes = SHAPES if b.settings.repeats > 1 else SHAPES[:4] + SHAPES[-1:]  # --quick: one layer and the head
        weights = {dt: [cpu_kernels.BlockedWeight.of(torch.randn(n, k, generator=g), dt) for n, k in shapes]
                   for dt in DTYPES}
        for rows in (1, b.settings.batch):
            xs = {k: torch.randn(rows, k, generator=g) for k in (576, 1536)}
            best = {dt: float("inf") for dt in DTYPES}
            for _ in range(max(3, 2 * b.settings.repeats)):
                for dt in DTYPES:
                    t = time.thread_time()
                    for w in weights[dt]:
                        cpu_kernels.linear(xs[w.in_features], w)
                    best[dt] = min(best[dt], time.thread_time() - t)
            path = "AVX-512 BF16 dot products, x rounded to bfloat16" if cpu_kernels.library().tt_linear16_path() \
                else "widened by shifts"
            for dt, what in ((torch.bfloat16, f"bfloat16 ({path})"), (torch.float16, "float16 (F16C)")):
                b.add("16-bit weights: a step's matrices, 1 thread", f"{what}, {rows} rows", best[dt] * 1e3, "ms",
                      best[torch.float32] * 1e3, "baseline: float32; the thread's CPU time, minimum over "
                      f"interleaved repeats; {len(shapes)} matrices (ratio < 1: faster)")
    finally:
        torch.set_num_threads(before)
