"""One SmolLM2-135M decode step's matrices at a decode batch of 1 / 4 / 8 / 16 rows, on one
thread: the C kernels' row tiles (engine/kernels/cpu_rows.c), their 8-row tiles (the order
of the work before the row tiles) and PyTorch's own GEMM (F.linear on the plain weight of
the same dtype: oneDNN / MKL, AMX or AVX-512 BF16 where the CPU has them) as a floor, at
float32, bfloat16 and float16, for every kernel build this CPU runs (native, x86-64-v3).

Timed by the thread's CPU time (a shared machine slows the wall clock unevenly), the minimum
over interleaved repeats; each matrix its own memory, so a pass streams them from DRAM as a
step does. PyTorch picks its own kernels by the CPU: for an AVX2-only floor on an AVX-512
machine run with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2.

    python benchmarks/batched_kernels.py [--rows 1,4,8,16] [--repeats 3] [--builds native,x86-64-v3]
    python benchmarks/batched_kernels.py --engine smollm2     # the whole decode, this build

--engine: the engine's decode at each batch, the row tiles on and off in turn (same tokens:
they give the same bits), one thread, the process's CPU time for n new tokens less that of
one, the minimum over interleaved repeats; TOKENTRACE_CPU_MARCH picks the build, and
TOKENTRACE_CPU_KERNELS=0 runs PyTorch's own paths (the floor) with the same command.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.kernels import cpu  # noqa: E402

# SmolLM2-135M: hidden 576, 9 query / 3 KV heads of 64, MLP 1536, vocabulary 49152, 30 layers
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def cpu_seconds(fn) -> float:
    t = time.thread_time()
    fn()
    return time.thread_time() - t


def step(lib, blocked: list[cpu.BlockedWeight], xs: dict[int, torch.Tensor], rows_from: int) -> float:
    """One pass over the matrices with the row tiles from `rows_from` rows (cpu.NEVER: off)."""
    kind = cpu.KINDS[blocked[0].dtype]
    before = lib.tt_rows_set(kind, rows_from)
    try:
        return cpu_seconds(lambda: [cpu.linear(xs[w.in_features], w, lib=lib) for w in blocked])
    finally:
        lib.tt_rows_set(kind, before)


def measure(builds: list[str], rows: list[int], repeats: int) -> dict[tuple, float]:
    """(what, dtype, rows) -> ms, the minimum over repeats; what: 'BUILD rows' / 'BUILD 8-row' / 'torch'."""
    g = torch.Generator().manual_seed(0)
    plain = [torch.randn(n, k, generator=g) * 0.05 for n, k in SHAPES]
    blocked = {dt: [cpu.BlockedWeight.of(w, dt) for w in plain] for dt in DTYPES}
    torch_w = {dt: [w.to(dt) for w in plain] for dt in DTYPES}
    del plain
    libs = {b: cpu.load(b) for b in builds}
    best: dict[tuple, float] = {}
    for t in rows:
        xs = {k: torch.randn(t, k, generator=g) for k in (576, 1536)}
        for _ in range(repeats):  # interleaved: drift in the machine's speed hits all alike
            for dt in DTYPES:
                for b, lib in libs.items():
                    for what, frm in (("rows", 1), ("8-row", cpu.NEVER)):
                        key = (f"{b} {what}", dt, t)
                        best[key] = min(best.get(key, 1e9), step(lib, blocked[dt], xs, frm) * 1e3)
                xd = {k: v.to(dt) for k, v in xs.items()}
                sec = cpu_seconds(lambda: [F.linear(xd[w.shape[1]], w) for w in torch_w[dt]])
                best[("torch", dt, t)] = min(best.get(("torch", dt, t), 1e9), sec * 1e3)
    return best


def engine_decode(model: str, rows: list[int], repeats: int, new_tokens: int) -> None:
    """See the top of this file (--engine): tok/s of one thread's CPU time, per dtype and batch."""
    from benchmarks.bench.timing import greedy, run_engine  # lazy: heavy, and only for --engine
    from benchmarks.peers import prompts_of  # lazy: as above
    from engine.llm_engine import LLMEngine  # lazy: as above
    prompts = prompts_of(model, max(rows), 32)
    lib = cpu.library()
    for dt in ("float32", "bfloat16", "float16"):
        engine = LLMEngine(model, device="cpu", dtype=dt)
        kind = cpu.KINDS[getattr(torch, dt)]
        modes = {"row tiles": None, "8-row tiles": cpu.NEVER} if lib is not None else {"torch": None}
        best: dict[tuple, float] = {}
        tokens: dict[tuple, list] = {}
        for b in rows:
            for _ in range(repeats):
                for mode, frm in modes.items():
                    before = lib.tt_rows_set(kind, frm) if lib is not None and frm is not None else None

                    def gen(n: int) -> list:
                        return [o["tokens"] for o in run_engine(engine, prompts[:b], [greedy(n)] * b).values()]
                    try:
                        gen(2)
                        t = time.process_time()
                        out = gen(new_tokens)
                        mid = time.process_time()
                        gen(1)
                        sec = (mid - t) - (time.process_time() - mid)
                    finally:
                        if before is not None:
                            lib.tt_rows_set(kind, before)
                    best[(mode, b)] = min(best.get((mode, b), 1e9), sec)
                    tokens[(mode, b)] = out
        for mode in modes:
            same = all(tokens[(mode, b)] == tokens[(next(iter(modes)), b)] for b in rows)
            cells = "  ".join(f"b{b} {b * (new_tokens - 1) / best[(mode, b)]:7.1f}" for b in rows)
            print(f"{dt:>8} {mode:<12} tok/s of CPU time: {cells}  (tokens as the first row's: {same})", flush=True)
        del engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,4,8,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--builds", default="native,x86-64-v3", help="kernel builds (-march values) to run")
    ap.add_argument("--engine", default=None, help="a model: time the engine's decode instead (see above)")
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [int(r) for r in args.rows.split(",")]
    if args.engine:
        print(f"load average at start {os.getloadavg()}; kernels: {cpu.march() if cpu.available() else 'off'}")
        engine_decode(args.engine, rows, args.repeats, args.new_tokens)
        print(f"load average at end {os.getloadavg()}")
        return
    if not cpu.available():
        sys.exit("the CPU kernels did not build (no C compiler?)")
    print(f"load average at start {os.getloadavg()}; torch's CPU capability {torch.backends.cpu.get_cpu_capability()}")
    best = measure(args.builds.split(","), rows, args.repeats)
    whats = sorted({k[0] for k in best}, key=lambda w: (w == "torch", w))
    for dt in DTYPES:
        for what in whats:
            cells = "  ".join(f"{t:>2} rows {best[(what, dt, t)]:7.1f} ms" for t in rows)
            print(f"{str(dt)[6:]:>8} {what:<20} {cells}")
    print(f"load average at end {os.getloadavg()}; ms: one thread's CPU time for {len(SHAPES)} matrices")


if __name__ == "__main__":
    main()
