"""The CPU kernels' read rate over one SmolLM2-135M decode step's matrices: float32
(engine/kernels/cpu_linear.c) against int8 / int4 (engine/kernels/cpu_quant.c).

Each of the 120 layer matrices (qkv, o, gate_up, down x 30) and the LM head is its own
memory, 600 MiB in float32, so a pass streams them from DRAM as a decode step does. GB/s
counts the bytes the kernel reads (float32: the blocked weight; int8 / int4: codes and
float32 scales / offsets). Interleaved repeats, median; the load average is printed beside,
as the machine may be shared (with other work on the cores, 2 OpenMP threads can stall).

    python benchmarks/cpu_kernels.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.kernels import cpu, cpu_quant  # noqa: E402

# SmolLM2-135M: hidden 576, 9 query / 3 KV heads of 64, MLP 1536, vocabulary 49152, 30 layers
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]


def weights() -> dict[str, list]:
    g = torch.Generator().manual_seed(0)
    out: dict[str, list] = {"float32": [], "int8": [], "int4": []}
    for n, k in SHAPES:
        out["float32"].append(cpu.BlockedWeight.of(torch.randn(n, k, generator=g)))
        d = torch.rand(n, k // 32, generator=g)
        out["int8"].append(cpu_quant.BlockedQuantWeight.int8(
            torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8), d))
        out["int4"].append(cpu_quant.BlockedQuantWeight.int4(
            torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8), d, -8 * d))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if not cpu_quant.available():
        sys.exit("the CPU kernels did not build (no C compiler?)")
    ws = weights()
    linear = {"float32": cpu.linear, "int8": cpu_quant.linear, "int4": cpu_quant.linear}
    print(f"load average at start {os.getloadavg()}")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for rows in (1, 8):
            xs = {k: torch.randn(rows, k) for k in (576, 1536)}
            wall: dict[str, list[float]] = {k: [] for k in ws}
            for _ in range(args.repeats):  # interleaved: drift in the machine's speed hits all alike
                for kind, mats in ws.items():
                    t = time.perf_counter()
                    for w in mats:
                        linear[kind](xs[w.in_features], w)
                    wall[kind].append(time.perf_counter() - t)
            cells = []
            for kind, mats in ws.items():
                sec = statistics.median(wall[kind])
                nbytes = sum(w.nbytes for w in mats)
                cells.append(f"{kind} {sec * 1e3:.1f} ms, {nbytes / sec / 1e9:.1f} GB/s of {nbytes / 2**20:.0f} MiB")
            print(f"{threads} thread(s), {rows} row(s): " + "; ".join(cells), flush=True)
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
