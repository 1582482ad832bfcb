"""Where rank 0 meets torchrun's ranks: torchrun's environment and its store.

The ranks are torchrun's processes, possibly on several machines. They wait in torchrun's
own store (its agent's, at MASTER_ADDR:MASTER_PORT, under a prefix for this run; without a
torchrun agent, rank 0 hosts one there, as init_method="env://" does) for engines to serve.
Every sharded engine rank 0 builds is a "generation" in that store: its ShardSpec under
spec_key(g), its process group under group_prefix(g) (protocol). When
rank 0 exits it stops its engines and writes EXIT as the next generation, then waits for
the ranks' goodbyes (the store may live in its process). The ranks' side of this is
serve_rank() in engine/parallel/worker.py.
"""
from __future__ import annotations

import atexit
import datetime
import os
import pickle
import sys
import threading
import time
import weakref
from dataclasses import dataclass

import torch.distributed as dist

from engine.parallel.protocol import (EXIT, READY, STARTUP_TIMEOUT_S, ShardSpec, bye_key, spec_key,
                                      status_key)

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
                         "start the ranks with `torchrun ... -m engine.parallel.torchrun app|generate ...`, "
                         "or call engine.parallel.worker.serve_rank() on ranks 1..N-1")
    if env.world_size != tensor_parallel_size:
        raise ValueError(f"tensor_parallel_size={tensor_parallel_size} but torchrun started "
                         f"WORLD_SIZE={env.world_size} processes: they must be equal")


def open_store(env: TorchrunEnv) -> dist.Store:
    """The store every rank shares: torchrun's agent's (a client of it, under this run's
    prefix), or, without an agent, one that rank 0 hosts at MASTER_PORT."""
    timeout = datetime.timedelta(seconds=STARTUP_TIMEOUT_S)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = dist.TCPStore(env.master_addr, env.master_port, None, False, timeout=timeout)
        run = f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        return dist.PrefixStore(f"tokentrace/{run}", store)
    return dist.TCPStore(env.master_addr, env.master_port, env.world_size, env.rank == 0, timeout=timeout,
                         wait_for_workers=False)


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
            _host = _Host(env, open_store(env), runners=weakref.WeakSet())
            atexit.register(_goodbye)
        return _host


def publish(env: TorchrunEnv, spec: ShardSpec, runner) -> tuple[dist.Store, int]:
    """A new engine's ShardSpec for the ranks: (the store, its generation). `runner` (its
    ParallelRunner) is shut down at rank 0's exit if it is still running then."""
    host = host_store(env)
    with _host_lock:
        gen, host.next_gen = host.next_gen, host.next_gen + 1
        host.runners.add(runner)
        host.store.set(spec_key(gen), pickle.dumps(spec))
    return host.store, gen


def wait_ready(store: dist.Store, gen: int, world_size: int, timeout_s: float = STARTUP_TIMEOUT_S) -> str | None:
    """None when ranks 1..N-1 loaded their shards of generation gen, else the first one's error."""
    deadline = time.monotonic() + timeout_s
    for rank in range(1, world_size):
        key = status_key(gen, rank)
        while not store.check([key]):
            if time.monotonic() > deadline:
                return f"tensor-parallel rank {rank} did not load its shard in {timeout_s:.0f} s"
            time.sleep(0.05)
        status = store.get(key).decode()
        if status != READY:
            return f"tensor-parallel rank {rank} (torchrun) failed to load its shard: {status}"
    return None


def _goodbye() -> None:
    """At rank 0's exit: stop the engines still running, then tell the ranks to finish."""
    host = _host
    try:
        for runner in list(host.runners):
            runner.shutdown()
        with _host_lock:
            host.store.set(spec_key(host.next_gen), EXIT)
            host.next_gen += 1
        deadline = time.monotonic() + 10
        for rank in range(1, host.env.world_size):  # the store may live in this process: let them read it first
            while not host.store.check([bye_key(rank)]) and time.monotonic() < deadline:
                time.sleep(0.05)
    except Exception as e:  # noqa: BLE001 - the store is gone (torchrun is tearing down): nothing to tell
        print(f"tokentrace rank 0: could not tell the ranks to finish ({type(e).__name__}: {e})",
              file=sys.stderr, flush=True)
