"""Start-up under torchrun: the ranks are torchrun's processes, possibly on several machines.

    torchrun --nproc-per-node 2 -m engine.parallel.launch app [python -m app's arguments]
    torchrun --nproc-per-node 2 -m engine.parallel.launch generate --model M --prompt P --max-tokens N

RANK 0 runs the engine (the app, or one greedy completion printed as JSON) with
tensor_parallel_size = WORLD_SIZE; its ParallelRunner sees the torchrun environment and
spawns nothing. Ranks 1..N-1 run serve_rank(): they wait in torchrun's own store (its
agent's, at MASTER_ADDR:MASTER_PORT, under a prefix for this run; without a torchrun agent,
rank 0 hosts one there, as init_method="env://" does) for engines to serve. Every sharded
engine rank 0 builds is a "generation" in that store: its ShardSpec
under gen{g}, its process group under the prefix tokentrace/gen{g}; a worker rank serves
each generation on its own thread (the app holds one engine per --model), and when rank 0
exits it writes "exit" as the next generation, so the ranks finish with exit code 0.
A rank 0 that dies is torchrun's failure: it stops the other ranks (and a rank waiting in
a step sees its collective fail and exits, 2).
"""
from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import pickle
import runpy
import signal
import sys
import threading
import time
import weakref
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

STARTUP_TIMEOUT_S = 600.0
_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class TorchrunEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    def device(self, device: str) -> str:
        """This rank's device: cuda:LOCAL_RANK (one GPU per process on each machine), or the CPU."""
        return f"cuda:{self.local_rank}" if device.startswith("cuda") else device

    def threads(self) -> int:  # the machine's cores shared by its torchrun processes
        return max(1, (os.cpu_count() or 1) // self.local_world_size)


def torchrun_env() -> TorchrunEnv | None:
    """The torchrun environment of this process, or None (not started by torchrun)."""
    if not all(k in os.environ for k in _ENV):
        return None
    e = os.environ
    return TorchrunEnv(int(e["RANK"]), int(e["WORLD_SIZE"]), int(e["LOCAL_RANK"]),
                       int(e.get("LOCAL_WORLD_SIZE", e["WORLD_SIZE"])), e["MASTER_ADDR"], int(e["MASTER_PORT"]))


def check_world(env: TorchrunEnv, tensor_parallel_size: int) -> None:
    """The refusals of a sharded engine built under torchrun."""
    if env.rank != 0:
        raise ValueError(f"under torchrun only rank 0 builds the sharded engine; this is rank {env.rank}: "
                         "start the ranks with `torchrun ... -m engine.parallel.launch app|generate ...`, "
                         "or call engine.parallel.launch.serve_rank() on ranks 1..N-1")
    if env.world_size != tensor_parallel_size:
        raise ValueError(f"tensor_parallel_size={tensor_parallel_size} but torchrun started "
                         f"WORLD_SIZE={env.world_size} processes: they must be equal")


# --- rank 0: the store, one generation per sharded engine -----------------------------------
@dataclass
class _Host:
    env: TorchrunEnv
    store: dist.Store
    next_gen: int = 0
    runners: weakref.WeakSet = None  # the engines' ParallelRunners, stopped at exit


_host: _Host | None = None
_host_lock = threading.Lock()


def host_store(env: TorchrunEnv) -> _Host:
    """Rank 0's store (made once per process; the ranks wait for it to come up)."""
    global _host
    with _host_lock:
        if _host is None:
            _host = _Host(env, _store(env), runners=weakref.WeakSet())
            atexit.register(_goodbye)
        return _host


def _store(env: TorchrunEnv) -> dist.Store:
    """The store every rank shares: torchrun's agent's (a client of it, under this run's
    prefix), or, without an agent, one that rank 0 hosts at MASTER_PORT."""
    timeout = datetime.timedelta(seconds=STARTUP_TIMEOUT_S)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = dist.TCPStore(env.master_addr, env.master_port, None, False, timeout=timeout)
        run = f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        return dist.PrefixStore(f"tokentrace/{run}", store)
    return dist.TCPStore(env.master_addr, env.master_port, env.world_size, env.rank == 0, timeout=timeout,
                         wait_for_workers=False)


def publish(env: TorchrunEnv, spec, runner) -> tuple[dist.Store, int]:
    """A new engine's ShardSpec for the ranks: (the store, its generation)."""
    host = host_store(env)
    with _host_lock:
        gen, host.next_gen = host.next_gen, host.next_gen + 1
        host.runners.add(runner)
        host.store.set(f"gen{gen}", pickle.dumps(spec))
    return host.store, gen


def wait_ready(store: dist.Store, gen: int, world_size: int, timeout_s: float = STARTUP_TIMEOUT_S) -> str | None:
    """None when ranks 1..N-1 loaded their shards of generation gen, else the first one's error."""
    deadline = time.monotonic() + timeout_s
    for rank in range(1, world_size):
        key = f"gen{gen}/rank{rank}"
        while not store.check([key]):
            if time.monotonic() > deadline:
                return f"tensor-parallel rank {rank} did not load its shard in {timeout_s:.0f} s"
            time.sleep(0.05)
        status = store.get(key).decode()
        if status != "ready":
            return f"tensor-parallel rank {rank} (torchrun) failed to load its shard: {status}"
    return None


def _goodbye() -> None:
    """At rank 0's exit: stop the engines still running, then tell the ranks to finish."""
    host = _host
    try:
        for runner in list(host.runners):
            runner.shutdown()
        with _host_lock:
            host.store.set(f"gen{host.next_gen}", b"exit")
            host.next_gen += 1
        deadline = time.monotonic() + 10
        for rank in range(1, host.env.world_size):  # the store may live in this process: let them read it first
            while not host.store.check([f"bye{rank}"]) and time.monotonic() < deadline:
                time.sleep(0.05)
    except Exception as e:  # noqa: BLE001 - the store is gone (torchrun is tearing down): nothing to tell
        print(f"tokentrace rank 0: could not tell the ranks to finish ({type(e).__name__}: {e})",
              file=sys.stderr, flush=True)


# --- ranks 1..N-1 ------------------------------------------------------------------------
def serve_rank(env: TorchrunEnv | None = None) -> int:
    """A worker rank: serve every sharded engine rank 0 builds, until rank 0 exits.
    Returns the exit code: 0 after rank 0's goodbye, 2 when rank 0 vanished without one."""
    env = env or torchrun_env()
    if env is None or env.rank == 0:
        raise ValueError("serve_rank() is for torchrun's ranks 1..N-1")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # torchrun passes Ctrl-C to every rank: rank 0 decides
    torch.set_num_threads(env.threads())
    store = _store(env)
    gen, threads = 0, []
    while True:
        try:
            while not store.check([f"gen{gen}"]):
                time.sleep(0.1)
            data = store.get(f"gen{gen}")
        except Exception:  # noqa: BLE001 - the store is gone (without an agent it lives in rank 0)
            print(f"rank {env.rank}: rank 0 is gone; exiting", file=sys.stderr, flush=True)
            return 2
        if data == b"exit":
            print(f"tokentrace rank {env.rank}/{env.world_size}: rank 0 finished; exiting", file=sys.stderr, flush=True)
            break
        t = threading.Thread(target=_serve_generation, args=(env, store, gen, pickle.loads(data)),
                             name=f"tokentrace-gen{gen}", daemon=True)
        t.start()
        threads.append(t)
        gen += 1
    for t in threads:  # rank 0 stopped its engines before its goodbye
        t.join(timeout=10)
    store.set(f"bye{env.rank}", b"1")
    return 0


def _serve_generation(env: TorchrunEnv, store: dist.Store, gen: int, spec) -> None:
    from engine.parallel.comm import Comm
    from engine.parallel.worker import load_shard, serve_steps

    spec = replace(spec, device=env.device(spec.device))
    try:
        comm = Comm.connect_with_store(store, env.rank, spec.world_size, torch.device(spec.device),
                                       STARTUP_TIMEOUT_S, prefix=f"tokentrace/gen{gen}")
        model, lcfg, kv = load_shard(spec, comm, progress=lambda *_: None)  # rank 0 shows the progress
    except Exception as e:  # noqa: BLE001 - rank 0 raises it; this rank waits for the next engine
        store.set(f"gen{gen}/rank{env.rank}", f"{type(e).__name__}: {e}".encode())
        return
    store.set(f"gen{gen}/rank{env.rank}", b"ready")
    print(f"tokentrace rank {env.rank}/{env.world_size}: serving {spec.path.name} (engine {gen}, "
          f"{lcfg.num_heads} of {spec.cfg.num_heads} query heads) on {spec.device}", file=sys.stderr, flush=True)
    serve_steps(comm, model, lcfg, kv, torch.device(spec.device))


# --- the entry point -------------------------------------------------------------------------
def _generate(argv: list[str], env: TorchrunEnv) -> None:
    from engine import LLM, SamplingParams

    p = argparse.ArgumentParser(prog="engine.parallel.launch generate",
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
        sys.exit("engine.parallel.launch runs under torchrun: "
                 "torchrun --nproc-per-node N -m engine.parallel.launch app|generate ...")
    if not argv or argv[0] not in ("app", "generate"):
        sys.exit("usage: torchrun ... -m engine.parallel.launch app [python -m app's arguments] | "
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
