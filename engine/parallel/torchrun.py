"""Start-up under torchrun: the ranks are torchrun's processes, possibly on several machines.

    torchrun --nproc-per-node 2 -m engine.parallel.torchrun app [python -m app's arguments]
    torchrun --nproc-per-node 2 -m engine.parallel.torchrun generate --model M --prompt P --max-tokens N

RANK 0 runs the engine (the app, or one greedy completion printed as JSON) with
tensor_parallel_size = WORLD_SIZE; its ParallelRunner sees the torchrun environment and
spawns nothing. Ranks 1..N-1 run serve_rank(): they serve each
engine rank 0 builds, on its own thread (the app holds one engine per --model), met in
torchrun's store (host_store), and finish with exit code 0 when rank 0
exits. A rank 0 that dies is torchrun's failure: it stops the other ranks (and a rank
waiting in a step sees its collective fail and exits, 2).
"""
from __future__ import annotations

import argparse
import json
import runpy
import sys
from dataclasses import replace

import torch

from engine import LLM, SamplingParams
from engine.parallel.rendezvous import TorchrunEnv, check_world, host_store, torchrun_env
from engine.parallel.worker import serve_rank


def _generate(argv: list[str], env: TorchrunEnv) -> None:
    p = argparse.ArgumentParser(prog="engine.parallel.torchrun generate",
                                description="one greedy completion on a model sharded over torchrun's ranks")
    p.add_argument("--model", default=None, help="path or catalog name (default: the embedded model)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--expert-parallel", action="store_true")
    args = p.parse_args(argv)
    with LLM(args.model, device=args.device, dtype=args.dtype, tensor_parallel_size=env.world_size,
             expert_parallel=args.expert_parallel) as llm:
        out = llm.generate([args.prompt], SamplingParams(temperature=0, max_tokens=args.max_tokens))[0]
        print(json.dumps({"world_size": env.world_size, "token_ids": out.token_ids, "text": out.text}), flush=True)


def _app_argv(argv: list[str], env: TorchrunEnv) -> list[str]:
    """python -m app's arguments with --tensor-parallel-size = WORLD_SIZE (refused if it differs)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--tensor-parallel-size", type=int, default=None)
    known, _ = p.parse_known_args(argv)
    if known.tensor_parallel_size is None:
        return argv + ["--tensor-parallel-size", str(env.world_size)]
    check_world(replace(env, rank=0), known.tensor_parallel_size)
    return argv


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    env = torchrun_env()
    if env is None:
        sys.exit("engine.parallel.torchrun runs under torchrun: "
                 "torchrun --nproc-per-node N -m engine.parallel.torchrun app|generate ...")
    if not argv or argv[0] not in ("app", "generate"):
        sys.exit("usage: torchrun ... -m engine.parallel.torchrun app [python -m app's arguments] | "
                 "generate --model M --prompt P [--max-tokens N]")
    command, rest = argv[0], argv[1:]
    if env.world_size < 2:
        sys.exit(f"torchrun started WORLD_SIZE={env.world_size} process: a sharded engine needs 2 or more")
    if env.rank != 0:
        return serve_rank(env)
    torch.set_num_threads(env.threads())
    try:
        if command == "app":
            rest = _app_argv(rest, env)
        host_store(env)  # at once: the ranks wait for it, and exit when rank 0 says goodbye
    except ValueError as e:
        sys.exit(f"cannot start: {e}")
    if command == "generate":
        try:
            _generate(rest, env)
        except (ValueError, OSError, RuntimeError) as e:
            sys.exit(f"cannot start: {' '.join(str(e).split()) or type(e).__name__}")
        return 0
    sys.argv = ["app", *rest]
    runpy.run_module("app", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
