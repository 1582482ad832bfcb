"""Where time to first token goes, stage by stage: tokenize, schedule, the batch's tensors,
embed, the norms, the layers' matmuls (qkv, o, gate/up, down), attention (less its
projections), the MLP's activation, the LM head, sampling, the step's bookkeeping, and the
Python between them, for SmolLM2-135M at each prompt length and dtype, on this build of the
C kernels and (--builds) others in fresh processes.

    python -m benchmarks.prefill_stages                                    # 37 / 512 / 2,048 tokens, float32, bfloat16
    python -m benchmarks.prefill_stages --builds native,x86-64-v3 --threads 1 --clock cpu

x86-64-v3 builds the AVX2 kernels (TOKENTRACE_CPU_MARCH) and caps oneDNN and MKL at AVX2, so
an AVX-512 machine stands in for one without it. The timers are forward hooks on the model's
modules and wrappers on the engine's stages, installed for the measured runs only; a fused
pass (rows within the C kernel's, every layer in one call) is timed as one part, "layers
fused in C". --clock cpu: this thread's CPU time, a steadier figure on a shared machine
(with --threads 1 it is all the work).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from typing import Callable

import torch

from benchmarks.bench.context import TEXT
from benchmarks.bench.timing import greedy, run_engine
from engine.config import EngineConfig
from engine.layers import fused
from engine.llm_engine import LLMEngine

MODULE_PARTS = {"qkv_proj": "qkv matmul", "o_proj": "o matmul", "gate_up_proj": "gate/up matmul",
                "down_proj": "down matmul", "lm_head": "LM head", "embed_tokens": "embed",
                "self_attn": "attention", "mlp": "mlp", "norm": "norms", "input_layernorm": "norms",
                "post_attention_layernorm": "norms"}
ENGINE_PARTS = {"_schedule": "schedule", "_sample": "sampling", "_commit": "commit (outputs, bookkeeping)"}
RUNNER_PARTS = {"prepare": "batch tensors", "run": "forward"}


class StageTimer:
    """Seconds per stage of the runs made while installed (install / remove)."""

    def __init__(self, engine: LLMEngine, clock: Callable[[], float]) -> None:
        self.engine, self.clock = engine, clock
        self.spent: dict[str, float] = defaultdict(float)
        self._undo: list[Callable[[], None]] = []

    def _wrap(self, owner: object, name: str, part: str) -> None:
        real = getattr(owner, name)

        def timed(*args, **kw):
            t = self.clock()
            try:
                return real(*args, **kw)
            finally:
                self.spent[part] += self.clock() - t
        own = name in vars(owner)  # a module's function: put back; a method: the instance attribute dropped
        setattr(owner, name, timed)  # on an object: shadows the method for this object only
        self._undo.append((lambda: setattr(owner, name, real)) if own else (lambda: delattr(owner, name)))

    def install(self) -> None:
        for name, part in ENGINE_PARTS.items():
            self._wrap(self.engine, name, part)
        for name, part in RUNNER_PARTS.items():
            self._wrap(self.engine.runner, name, part)
        self._wrap(fused, "stack_forward", "layers fused in C")
        starts: dict[int, float] = {}
        for name, m in self.engine.runner.model.named_modules():
            part = MODULE_PARTS.get(name.rsplit(".", 1)[-1])
            if part is None:
                continue
            pre = m.register_forward_pre_hook(lambda mod, a: starts.__setitem__(id(mod), self.clock()))
            post = m.register_forward_hook(lambda mod, a, o, p=part: self.spent.__setitem__(
                p, self.spent[p] + self.clock() - starts[id(mod)]))
            self._undo += [pre.remove, post.remove]

    def remove(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()


def breakdown(spent: dict[str, float], total: float, tokenize: float) -> dict[str, float]:
    """The stages as disjoint parts that add up to the TTFT: nested timers less what they contain."""
    s = dict(spent)
    out = {"tokenize": tokenize, "schedule": s.get("schedule", 0.0), "batch tensors": s.get("batch tensors", 0.0)}
    out["embed"] = s.get("embed", 0.0)
    out["norms"] = s.get("norms", 0.0)
    for k in ("qkv matmul", "o matmul", "gate/up matmul", "down matmul"):
        out[k] = s.get(k, 0.0)
    out["attention (less qkv, o)"] = s.get("attention", 0.0) - out["qkv matmul"] - out["o matmul"]
    out["MLP activation (less its matmuls)"] = s.get("mlp", 0.0) - out["gate/up matmul"] - out["down matmul"]
    out["layers fused in C"] = s.get("layers fused in C", 0.0)
    out["LM head"] = s.get("LM head", 0.0)
    inside = sum(out[k] for k in list(out)[3:])
    out["forward: Python and ops between the modules"] = s.get("forward", 0.0) - inside
    out["sampling"] = s.get("sampling", 0.0)
    out["commit (outputs, bookkeeping)"] = s.get("commit (outputs, bookkeeping)", 0.0)
    out["the rest (add_request, step, Python)"] = total + tokenize - sum(out.values())
    return out


def measure(engine: LLMEngine, text_ids: list[int], n: int, rounds: int, clock: Callable[[], float]) -> dict:
    """Median TTFT of `rounds` plain runs, then the stages of the fastest of `rounds` timed ones."""
    prompt = text_ids[:n]
    text = engine.tokenizer.decode(prompt)
    run_engine(engine, [prompt], [greedy(1)])  # warm-up
    plain = []
    for _ in range(rounds):
        t = clock()
        ids = engine.tokenizer.encode(text, add_special_tokens=False)
        run_engine(engine, [ids], [greedy(1)])
        plain.append(clock() - t)
    best = None
    for _ in range(rounds):
        t = clock()
        engine.tokenizer.encode(text, add_special_tokens=False)
        tokenize = clock() - t
        timer = StageTimer(engine, clock)
        timer.install()
        try:
            t = clock()
            run_engine(engine, [prompt], [greedy(1)])
            total = clock() - t
        finally:
            timer.remove()
        if best is None or total + tokenize < best[0]:
            best = (total + tokenize, breakdown(timer.spent, total, tokenize))
    return {"ttft_ms": 1e3 * sorted(plain)[len(plain) // 2], "timed_ms": 1e3 * best[0],
            "stages_ms": {k: round(1e3 * v, 2) for k, v in best[1].items()}}


def run_build(args: argparse.Namespace) -> list[dict]:
    """This process's build: every dtype and length."""
    from engine.kernels import cpu as cpu_kernels  # lazy: its build reads TOKENTRACE_CPU_MARCH, set by the parent
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    rows = []
    for dtype in args.dtypes.split(","):
        engine = LLMEngine(args.model, device="cpu", dtype=dtype, config=EngineConfig(enable_prefix_caching=False))
        ids = engine.tokenizer.encode(TEXT, add_special_tokens=False) * 64
        for n in (int(x) for x in args.lengths.split(",")):
            got = measure(engine, ids, n, args.rounds if n < 1024 else max(1, args.rounds // 2), clock)
            bits = cpu_kernels.library().tt_vector_bits() if cpu_kernels.available() else 0
            rows.append({"build": cpu_kernels.march(), "vector_bits": bits, "amx_bf16": cpu_kernels.amx_bf16(),
                         "dtype": dtype, "tokens": n, **got})
        del engine
    return rows


BUILD_ENV = {"x86-64-v3": {"TOKENTRACE_CPU_MARCH": "x86-64-v3", "ONEDNN_MAX_CPU_ISA": "AVX2",
                           "MKL_ENABLE_INSTRUCTIONS": "AVX2"}}


def other_build(build: str, argv: list[str]) -> list[dict]:
    """A build in a fresh process (the kernels are built and oneDNN's ISA read once a process)."""
    env = {**os.environ, **BUILD_ENV.get(build, {"TOKENTRACE_CPU_MARCH": build})}
    done = subprocess.run([sys.executable, "-m", "benchmarks.prefill_stages", *argv, "--builds", "this", "--json"],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {build} build's run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    """One column a run (build, dtype, tokens), one line a stage, ms."""
    heads = [f"{r['build']} {r['dtype']} {r['tokens']}" for r in rows]
    stages = list(rows[0]["stages_ms"])
    width = max(len(s) for s in stages) + 2
    lines = [" " * width + "".join(f"{h:>26}" for h in heads),
             f"{'TTFT (median, no timers)':<{width}}" + "".join(f"{r['ttft_ms']:>26.1f}" for r in rows),
             f"{'TTFT with the timers':<{width}}" + "".join(f"{r['timed_ms']:>26.1f}" for r in rows)]
    lines += [f"{s:<{width}}" + "".join(f"{r['stages_ms'][s]:>26.2f}" for r in rows) for s in stages]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.prefill_stages", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--lengths", default="37,512,2048", help="prompt tokens")
    ap.add_argument("--builds", default="this", help="'this' (this process), or march values run in fresh "
                    "processes: native, x86-64-v3 (AVX2, oneDNN and MKL capped at AVX2)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="cpu: this thread's CPU time")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print the rows as one JSON line (the parent reads it)")
    args = ap.parse_args(argv)
    inner = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--json"]
    inner = [a for i, a in enumerate(inner) if a != "--builds" and (i == 0 or inner[i - 1] != "--builds")]
    rows: list[dict] = []
    for build in args.builds.split(","):
        rows += run_build(args) if build == "this" else other_build(build, inner)
    if args.json:
        print(json.dumps(rows))
    else:
        print(table(rows))
        print(f"load average (1, 5, 15 min) {os.getloadavg()}; {args.threads} threads; clock {args.clock}")
    return rows


if __name__ == "__main__":
    main()
