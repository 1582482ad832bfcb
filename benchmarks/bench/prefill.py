"""Where a prefill's time goes (section `prefill`): SmolLM2-135M's time to first token for a
37-token prompt (and 512 / 2,048 tokens: --sections prefill on a quiet machine) at float32,
bfloat16 and float16, cut into stages by benchmarks.prefill_stages (tokenize, schedule, embed,
each matmul kind, attention, the fused C layers, the LM head, sampling and the Python between
them; its timers are installed for the timed runs only). Each TTFT is also run with the C
kernels capped at MAX_ROWS (the path before kernels.cpu.kernel_rows: PyTorch's GEMM and the
modules past 32 rows), the two interleaved in one process: the ratio is what the kernel's
prefill rows buy."""
from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from benchmarks.bench.context import Bench
from benchmarks.bench.real_model import label
from benchmarks.bench.timing import greedy, run_engine
from benchmarks.prefill_stages import measure
from engine.kernels import cpu as cpu_kernels
from engine.llm_engine import LLMEngine


def ttft(engine: LLMEngine, prompt: list[int]) -> float:
    t = time.perf_counter()
    run_engine(engine, [prompt], [greedy(1)])
    return time.perf_counter() - t


@contextmanager
def capped() -> Iterator[None]:
    """The C kernels (and so the fused layers) take MAX_ROWS rows at most while inside."""
    saved, amx = dict(cpu_kernels.PREFILL_KERNEL_ROWS), cpu_kernels.AMX_BF16_ROWS
    cpu_kernels.PREFILL_KERNEL_ROWS.update({k: 0 for k in saved})
    cpu_kernels.AMX_BF16_ROWS = cpu_kernels.MAX_ROWS
    cpu_kernels.kernel_rows.cache_clear()
    try:
        yield
    finally:
        cpu_kernels.PREFILL_KERNEL_ROWS.update(saved)
        cpu_kernels.AMX_BF16_ROWS = amx
        cpu_kernels.kernel_rows.cache_clear()


def prefill(b: Bench, name: str = "smollm2") -> None:
    if b.cuda or not cpu_kernels.available():
        return
    real = Bench(Path(name), None, b.device, b.settings)
    lengths = (37,) if b.settings.repeats <= 1 else (37, 512, 2048)
    path = f"{cpu_kernels.library().tt_vector_bits()}-bit vectors (-march={cpu_kernels.march()})"
    for dtype in ("float32", "bfloat16", "float16"):
        engine = real.engine(dtype=dtype, enable_prefix_caching=False)  # each run a whole prefill
        text = real.prompts[0] * 64
        for n in lengths:
            prompt = text[:n]
            ttft(engine, prompt)  # warm-up
            rounds = max(3, 2 * b.settings.repeats) if n < 512 else 3
            new, old = [], []
            for _ in range(rounds):
                new.append(ttft(engine, prompt))
                with capped():
                    old.append(ttft(engine, prompt))
            new_ms, old_ms = sorted(new)[len(new) // 2] * 1e3, sorted(old)[len(old) // 2] * 1e3
            b.add(f"{label(name)}: prefill ({path})", f"{dtype} TTFT, {n}-token prompt", new_ms, "ms", old_ms,
                  f"baseline: the C kernels capped at {cpu_kernels.MAX_ROWS} rows (PyTorch's GEMM and the "
                  f"modules past them); medians of {rounds} interleaved rounds (ratio < 1: faster)")
            got = measure(engine, text, n, 3, time.perf_counter)
            for k, v in got["stages_ms"].items():
                b.add(f"{label(name)}: prefill breakdown ({path})", f"{dtype} {n} tokens: {k}", v, "ms",
                      got["timed_ms"], "baseline: the whole TTFT, fastest of 3 with the stages' timers on")
        del engine
