"""Where a prefill's time goes (section `prefill`): SmolLM2-135M's time to first token for a
37-token prompt (and 512 / 2,048 tokens: --sections prefill on a quiet machine) at float32,
bfloat16 and float16, cut by module: the layers' matmuls per kind (qkv, o, gate/up, down),
attention, the norms, the LM head, and the rest of the step (tokenize-free: the ids are given;
scheduling, embedding, sampling and Python). The timers are forward hooks this section installs
on the model's modules and removes after, so the normal path carries none. Each TTFT is also
run with the C kernels capped at MAX_ROWS (the path before kernels.cpu.kernel_rows), the two
interleaved in one process: the ratio is what the kernel's prefill rows buy."""
from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

from torch import nn

from benchmarks.bench.context import Bench
from benchmarks.bench.real_model import label
from benchmarks.bench.timing import greedy, run_engine
from engine.kernels import cpu as cpu_kernels
from engine.llm_engine import LLMEngine

KINDS = {"qkv_proj": "qkv", "q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "o_proj": "o",
         "gate_up_proj": "gate/up", "gate_proj": "gate/up", "up_proj": "gate/up", "down_proj": "down",
         "lm_head": "LM head"}


def _kind(name: str, module: nn.Module) -> str | None:
    leaf = name.rsplit(".", 1)[-1]
    if leaf in KINDS:
        return KINDS[leaf]
    kind = type(module).__name__
    if kind == "Attention" or leaf in ("attn", "self_attn"):
        return "attention (with its projections)"
    if "Norm" in kind:
        return "norms"
    if "Embedding" in kind:
        return "embed"
    return None


def timed_prefill(engine: LLMEngine, prompt: list[int]) -> tuple[float, dict[str, float]]:
    """One request's TTFT (1 new token) and the seconds each kind of module took in it."""
    spent: dict[str, float] = defaultdict(float)
    starts: dict[int, float] = {}
    handles = []
    for name, m in engine.runner.model.named_modules():
        kind = _kind(name, m)
        if kind is None:
            continue
        handles.append(m.register_forward_pre_hook(lambda mod, args: starts.__setitem__(id(mod), time.perf_counter())))
        handles.append(m.register_forward_hook(
            lambda mod, args, out, k=kind: spent.__setitem__(k, spent[k] + time.perf_counter() - starts[id(mod)])))
    try:
        t = time.perf_counter()
        run_engine(engine, [prompt], [greedy(1)])
        total = time.perf_counter() - t
    finally:
        for h in handles:
            h.remove()
    return total, dict(spent)


def ttft(engine: LLMEngine, prompt: list[int]) -> float:
    t = time.perf_counter()
    run_engine(engine, [prompt], [greedy(1)])
    return time.perf_counter() - t


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
                cpu_kernels.kernel_rows.cache_clear()
                saved = dict(cpu_kernels.PREFILL_KERNEL_ROWS)
                cpu_kernels.PREFILL_KERNEL_ROWS.update({k: 0 for k in saved})
                try:
                    old.append(ttft(engine, prompt))
                finally:
                    cpu_kernels.PREFILL_KERNEL_ROWS.update(saved)
                    cpu_kernels.kernel_rows.cache_clear()
            new_ms, old_ms = sorted(new)[len(new) // 2] * 1e3, sorted(old)[len(old) // 2] * 1e3
            b.add(f"{label(name)}: prefill ({path})", f"{dtype} TTFT, {n}-token prompt", new_ms, "ms", old_ms,
                  f"baseline: the C kernels capped at {cpu_kernels.MAX_ROWS} rows (the GEMM on a copy widened "
                  f"back each call); medians of {rounds} interleaved rounds (ratio < 1: faster)")
            total, spent = min((timed_prefill(engine, prompt) for _ in range(3)), key=lambda r: r[0])
            attn = spent.pop("attention (with its projections)", 0.0)
            spent["attention (less qkv, o)"] = attn - spent.get("qkv", 0.0) - spent.get("o", 0.0)
            spent["the rest (schedule, sampling, Python)"] = total - sum(v for k, v in spent.items())
            for k, v in spent.items():
                b.add(f"{label(name)}: prefill breakdown ({path})", f"{dtype} {n} tokens: {k}", v * 1e3, "ms",
                      total * 1e3, "baseline: the whole TTFT, fastest of 3 with the bench's timers (hooks) on")
        del engine
