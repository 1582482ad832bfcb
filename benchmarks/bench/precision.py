"""16-bit weights on the CPU (--dtype bfloat16 / float16: the C kernels keep the weights in
16 bits and compute in float32): decode speed against the float32 engine in the same runs,
how far the answers move from float32's (as the quant section measures it), and the
resident memory a load adds against the weights plus the KV pool."""
from __future__ import annotations

from pathlib import Path

from benchmarks.bench import resident
from benchmarks.bench.context import Bench
from benchmarks.bench.quantized import agreement_rows
from benchmarks.bench.real_model import label
from benchmarks.bench.timing import decode_rate, decode_times, greedy, repeat_spread, run_engine
from engine.kernels import cpu as cpu_kernels
from engine.llm_engine import LLMEngine

DTYPES = ("bfloat16", "float16")


def precision(b: Bench, name: str = "smollm2") -> None:
    """SmolLM2-135M-Instruct (by default) at float32, bfloat16 and float16 on the CPU."""
    if b.cuda:
        return  # the CUDA path keeps PyTorch's own 16-bit kernels: the gpu section covers it
    real = Bench(Path(name), None, b.device, b.settings)
    engines = {"float32": real.engine(dtype="float32"), **{d: real.engine(dtype=d) for d in DTYPES}}
    bf16 = "AVX-512 BF16 dot products" if cpu_kernels.library().tt_linear16_path() else "widened by shifts"
    precision_speed(b, real, engines, f"{label(name)}: 16-bit weights decode",
                    {"bfloat16": f"bfloat16 {bf16}", "float16": "float16 widened by F16C (or bit arithmetic)"})
    agreement_rows(b, real, engines, DTYPES, f"{label(name)}: 16-bit weights agreement",
                   lambda e: f"weights {e.describe().model.dtype} in the C kernels, float32 sums",
                   (1e3, "mnats"))
    for dtype in ("float32", "bfloat16"):
        r = resident.in_subprocess(name, dtype)
        b.add(f"{label(name)}: 16-bit weights memory", f"{dtype}: resident growth of a load", r["rss_growth"] / 2**20,
              "MiB", (r["weights"] + r["kv_pool"]) / 2**20,
              f"baseline: weights {r['weights'] / 2**20:,.0f} MiB + KV pool {r['kv_pool'] / 2**20:,.0f} MiB "
              f"(+ RoPE tables {r['rope_tables'] / 2**20:,.0f} MiB: {r['ratio_with_rope']:.2f}x); anonymous pages "
              f"{r['anon_growth'] / 2**20:,.0f} MiB: {r['ratio_anon']:.2f}x; fresh process, "
              "tokenizer built before the baseline")


def precision_speed(b: Bench, real: Bench, engines: dict[str, LLMEngine], section: str,
                    notes: dict[str, str]) -> None:
    """Each dtype's decode rate at batch 1 and `batch` against float32, interleaved repeats."""
    s = b.settings
    for batch in (1, s.batch):
        prompts = real.prompts[:batch]
        runs = {k: (lambda n, e=e: run_engine(e, prompts, [greedy(n)] * batch)) for k, e in engines.items()}
        for fn in runs.values():  # warm-up
            fn(2)
        times = decode_times(runs, s.new_tokens, 2 * s.repeats)
        n = batch * (s.new_tokens - 1)
        for k in DTYPES:
            spread = repeat_spread(times["float32"], times["float321"], times[k], times[k + "1"])
            b.add(section, f"{k} batch {batch} decode tok/s", decode_rate(times, k, n), "tok/s",
                  decode_rate(times, "float32", n), f"baseline: this engine float32; {spread}; {notes[k]}")
