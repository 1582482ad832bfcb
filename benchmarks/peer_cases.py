"""The side by side's other cases (benchmarks/peers.py): time to first token for a prompt of
each length (a short chat-sized one, and prefills of 512 and 2,048 tokens), the CPU's vector
unit and its family (which names the results file), and the floor any machine can measure
without the peers: PyTorch's own GEMMs on the model's matrices, at the same rows."""
from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from engine.kernels import cpu as cpu_kernels
from engine.layers.linear import Linear
from engine.layers.prefill_gemm import widened


def cpu_flags() -> set[str]:
    if not os.path.exists("/proc/cpuinfo"):
        return set()
    with open("/proc/cpuinfo") as f:
        return set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))


def vector_unit(flags: set[str] | None = None) -> tuple[str, str]:
    """(what the CPU's vector unit does, in words; its family, a file-name key):
    AVX-512 with BF16 / VNNI (and AMX), AVX-512, AVX2, or neither."""
    flags = cpu_flags() if flags is None else flags
    if "avx512f" in flags:
        extras = [name for flag, name in (("avx512_bf16", "BF16"), ("avx512_vnni", "VNNI"), ("amx_bf16", "AMX"))
                  if flag in flags]
        words = "AVX-512" + (f" with {'/'.join(extras)}" if extras else "")
        return words, "avx512" + "".join(f"-{e.lower()}" for e in extras)
    if "avx2" in flags:
        return "AVX2 (no AVX-512)", "avx2"
    return "no AVX2", "baseline"


def ttft_rounds(found: list, prompts: dict[int, list[int]], repeats: int, pause: float) -> dict[str, dict[int, list]]:
    """Each peer's time to first token (1 new token) for each prompt length, interleaved rounds
    after a warm-up run of each: peer name -> length -> seconds per round."""
    times: dict[str, dict[int, list[float]]] = {p.name: {n: [] for n in prompts} for p in found}
    for peer in found:
        for p in prompts.values():
            peer.generate([p], 1)
    for _ in range(repeats):
        for n, p in prompts.items():
            for peer in found:
                time.sleep(pause)
                t = time.perf_counter()
                peer.generate([p], 1)
                times[peer.name][n].append(time.perf_counter() - t)
    return times


def ttft_table(times: dict[str, dict[int, list[float]]]) -> list[dict]:
    """Median ms per length and the ratio to the first peer (this engine's float32; < 1: faster)."""
    base = next(iter(times.values()))
    rows = []
    for name, by_len in times.items():
        row = {"engine": name}
        for n, ts in by_len.items():
            ms = 1e3 * statistics.median(ts)
            row[f"ttft {n}"] = {"ms": round(ms, 1), "ratio": round(ms / (1e3 * statistics.median(base[n])), 3)}
        rows.append(row)
    return rows


def matrices(model: torch.nn.Module) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """The model's layer matrices [out, in] (float32, row-major) and its LM head's."""
    layers, head = [], None
    for name, m in model.named_modules():
        if not isinstance(m, Linear):
            continue
        w = widened(m.blocked) if m.blocked is not None else m.weight.detach().float()
        if name.endswith("lm_head"):
            head = w
        else:
            layers.append(w)
    return layers, head


def gemm_floor(model: torch.nn.Module, dtype: torch.dtype, rows: list[int], repeats: int) -> dict[int, float]:
    """Seconds of one pass's matmuls by PyTorch's own GEMM (F.linear, weights and x in `dtype`)
    at each row count, the LM head on one row: what any engine built on those GEMMs pays at
    least (no attention, norms or Python). Median of `repeats`."""
    layers, head = matrices(model)
    ws = [w.to(dtype) for w in layers]
    hw = None if head is None else head.to(dtype)
    out = {}
    for n in rows:
        x = torch.randn(n, max(w.shape[1] for w in ws)).to(dtype)

        def one_pass() -> None:
            for w in ws:
                F.linear(x[:, :w.shape[1]], w)
            if hw is not None:
                F.linear(x[-1:, :hw.shape[1]], hw)
        one_pass()
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            one_pass()
            ts.append(time.perf_counter() - t)
        out[n] = statistics.median(ts)
    del ws
    return out


def floor_rows(model: torch.nn.Module, dtypes: list[str], lengths: list[int], batches: list[int], repeats: int,
               say: Callable[[str], None]) -> list[dict]:
    """The GEMM floor at each dtype: TTFT at each prompt length (ms) and a decode step's rate
    at each batch (tok/s)."""
    rows = []
    for name in dtypes:
        dtype = getattr(torch, name)
        got = gemm_floor(model, dtype, sorted(set(lengths) | set(batches)), repeats)
        row = {"engine": f"PyTorch GEMMs alone {name}"}
        row.update({f"ttft {n}": {"ms": round(1e3 * got[n], 1)} for n in lengths})
        row.update({f"batch {b}": {"tok/s": round(b / got[b], 1)} for b in batches})
        rows.append(row)
        say(f"{row['engine']:<28}" + "".join(f"  {k}: {v}" for k, v in row.items() if k != "engine"))
    return rows


def kernel_build() -> str:
    """The C kernels' build, in words."""
    if not cpu_kernels.available():
        return "C kernels off"
    return f"C kernels -march={cpu_kernels.march()}, {cpu_kernels.library().tt_vector_bits()}-bit vectors"
