"""The worker ranks: ranks 1..N-1 of a sharded engine, each holding its shard of the model
and its own KV pages for its heads, running rank 0's forward passes in lockstep (the
all-reduces inside the layers keep them in step). Rank 0's side is engine/parallel/runner.py;
what they say to each other, protocol.

Two ways to be a worker: spawned by rank 0's ParallelRunner (worker_main: one engine, then
the process ends), or one of torchrun's processes (serve_rank: every engine rank 0 builds,
each on its own thread, until rank 0 exits). Either way the loop is serve_steps(). Only
rank 0 computes logits (the LM head is replicated), so nothing comes back but, for traced
requests, the collectives' timings and, for `full` traces, each rank's heads' attention.

A worker whose rank 0 disappears (its parent process gone, or the broadcast failing) exits
on its own, so nothing is left behind; a step that fails here exits too, and rank 0's next
collective fails (gloo closes this rank's connections).
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import replace

import torch
from tqdm.std import tqdm

from engine.checkpoint.weights import build_model, load_weights
from engine.config import ModelConfig, ProgressFn
from engine.layers.linear import pack_weights
from engine.trace.capture import PassCapture, attention_probs, keep_keys, key_window
from engine.batch import ForwardBatch
from engine.parallel.comm import Comm
from engine.parallel.protocol import (EXIT, READY, SHUTDOWN, STARTUP_TIMEOUT_S, ShardSpec, bye_key, decode_batch,
                                      error_text, group_prefix, spec_key, status_key, wants_timings)
from engine.parallel.rendezvous import TorchrunEnv, open_store, torchrun_env
from engine.parallel.shard import local_config, shard_model


def load_shard(spec: ShardSpec, comm: Comm, progress: ProgressFn | None = None):
    """This rank's model (its slices of the checkpoint, all-reduces in place) and KV pool."""
    device = torch.device(spec.device)
    cfg = spec.cfg
    with torch.device("cpu"):  # the whole checkpoint first, on the host; then the slices
        full = build_model(cfg, spec.max_model_len, spec.dtype, torch.device("cpu"))
        load_weights(full, spec.path, progress)
    lcfg = local_config(cfg, spec.world_size, spec.expert_parallel)
    local = build_model(lcfg, spec.max_model_len, spec.dtype, device)
    model = shard_model(full, local, cfg, comm, spec.expert_parallel)
    del full
    pack_weights(model)
    kinds, heads, dims = lcfg.kv_layout  # K and V of this rank's KV heads, or MLA's whole latent
    kv = torch.zeros(kinds, cfg.num_layers, spec.num_blocks, spec.block_size, heads, dims,
                     dtype=spec.dtype, device=device)
    for i, attn in enumerate(model.attention_layers()):
        attn.k_cache, attn.v_cache = kv[0, i], kv[-1, i]
    return model, lcfg, kv


def local_attention_probs(batch: ForwardBatch, capture: PassCapture, cfg: ModelConfig, kv: torch.Tensor,
                          b: int) -> torch.Tensor:
    """Sequence b's attention probabilities for this rank's heads, every captured layer:
    [L, local heads, rows, keys] (attention_probs, on this rank's shard)."""
    spec = capture.specs[b]
    layers = [layer for layer in spec.attention_layers if layer in capture.layer_q]
    end, ctx = batch.query_starts[b + 1], batch.context_lens[b]
    rows = min(end - batch.query_starts[b], spec.max_keys)
    q = torch.stack([capture.layer_q[layer][end - rows:end] for layer in layers])
    k = kv[0].index_select(1, batch.block_tables[b, : -(-ctx // kv.shape[3])])
    k = k.index_select(0, torch.tensor(layers, device=k.device)).flatten(1, 2)
    probs = attention_probs(q, k, ctx, cfg.attention_scale, [cfg.sliding_windows[i] for i in layers])
    return keep_keys(probs, *key_window(ctx, spec.max_keys, spec.first_keys)).contiguous()


def gather_attention(batch: ForwardBatch, capture: PassCapture, cfg: ModelConfig, kv: torch.Tensor,
                     comm: Comm) -> dict[int, torch.Tensor]:
    """Every rank's probabilities of every sequence that captures attention, side by side
    by head on every rank: {b: [L, heads, rows, keys]}. Same order of calls on every rank."""
    out = {}
    for b, spec in enumerate(capture.specs):
        if spec is None or not spec.attention_layers:
            continue
        mine = local_attention_probs(batch, capture, cfg, kv, b)
        parts = [torch.empty_like(mine) for _ in range(comm.world_size)]
        comm.group.allgather([parts], [mine]).wait()
        out[b] = torch.cat(parts, dim=1)
    return out


def _watch_parent(parent: int) -> None:
    """Exit when the engine's process is gone (killed without a chance to stop us)."""
    while True:
        if os.getppid() != parent:
            os._exit(3)
        time.sleep(0.5)


def worker_main(rank: int, spec: ShardSpec, parent: int, conn) -> None:
    """A spawned rank (torch.multiprocessing, spawn): load the shard, answer over `conn`,
    serve rank 0's steps, exit. Every end is os._exit: no interpreter teardown (torch's, and
    the process group's, whose other end rank 0 still holds), so this process must hold
    nothing that outlives it: no named semaphore, no shared memory (see the tqdm lock)."""
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: rank 0 decides
    # tqdm's default lock is a multiprocessing RLock: in a process started by spawn, a named
    # semaphore that only multiprocessing's exit handlers unlink. A worker ending in os._exit
    # (or terminated, or killed) never runs them, and the resource tracker warns at the
    # engine's exit of "leaked semaphore objects", one per worker. This rank draws no bars.
    tqdm.set_lock(threading.RLock())
    torch.set_num_threads(spec.threads)
    try:
        comm = Comm.connect("127.0.0.1", spec.port, rank, spec.world_size, torch.device(spec.device))
        model, lcfg, kv = load_shard(spec, comm, progress=lambda *_: None)  # rank 0 shows the progress
        conn.send((READY, None))
    except BaseException as e:  # noqa: BLE001 - reported to rank 0, which raises it
        conn.send(("error", error_text(e)))
        os._exit(1)
    serve_steps(comm, model, lcfg, kv, torch.device(spec.device))
    conn.close()
    os._exit(0)


def serve_steps(comm: Comm, model, lcfg: ModelConfig, kv: torch.Tensor, device: torch.device) -> None:
    """A worker rank's loop: rank 0's batches, in lockstep, until its shutdown message
    (returns). Exits the process when rank 0 is gone (2) or a step fails here (1): under
    torchrun this runs on a thread of its own, and the process must end all the same."""
    with torch.inference_mode():
        while True:
            try:
                msg = comm.broadcast_object(None)
            except Exception as e:  # rank 0 is gone (said in a line: a rank that exits 2 while rank 0 lives is a bug)
                print(f"tokentrace rank {comm.rank}: waiting for rank 0's step failed ({type(e).__name__}: {e}); "
                      "exiting", file=sys.stderr, flush=True)
                os._exit(2)
            if msg is SHUTDOWN:
                return
            try:
                batch, capture = decode_batch(msg, device)
                model(batch, capture)
                log = comm.take_log()
                if wants_timings(msg):  # the same collectives in the same order as rank 0's run()
                    comm.gather_timings(log)
                if capture is not None:
                    gather_attention(batch, capture, lcfg, kv, comm)
            except Exception:
                traceback.print_exc()
                os._exit(1)


# --- torchrun's ranks 1..N-1 (rendezvous has rank 0's side) -------------------------------------
def serve_rank(env: TorchrunEnv | None = None) -> int:
    """A worker rank: serve every sharded engine rank 0 builds, until rank 0 exits.
    Returns the exit code: 0 after rank 0's goodbye, 2 when rank 0 vanished without one."""
    env = env or torchrun_env()
    if env is None or env.rank == 0:
        raise ValueError("serve_rank() is for torchrun's ranks 1..N-1")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # torchrun passes Ctrl-C to every rank: rank 0 decides
    torch.set_num_threads(env.threads())
    store = open_store(env)
    gen, threads = 0, []
    while True:
        try:
            while not store.check([spec_key(gen)]):
                time.sleep(0.1)
            data = store.get(spec_key(gen))
        except Exception:  # noqa: BLE001 - the store is gone (without an agent it lives in rank 0)
            print(f"rank {env.rank}: rank 0 is gone; exiting", file=sys.stderr, flush=True)
            return 2
        if data == EXIT:
            print(f"tokentrace rank {env.rank}/{env.world_size}: rank 0 finished; exiting", file=sys.stderr, flush=True)
            break
        t = threading.Thread(target=_serve_generation, args=(env, store, gen, pickle.loads(data)),
                             name=f"tokentrace-gen{gen}", daemon=True)
        t.start()
        threads.append(t)
        gen += 1
    for t in threads:  # rank 0 stopped its engines before its goodbye
        t.join(timeout=10)
    store.set(bye_key(env.rank), b"1")
    return 0


def _serve_generation(env: TorchrunEnv, store, gen: int, spec: ShardSpec) -> None:
    spec = replace(spec, device=env.device(spec.device))
    try:
        comm = Comm.connect_with_store(store, env.rank, spec.world_size, torch.device(spec.device),
                                       STARTUP_TIMEOUT_S, prefix=group_prefix(gen))
        model, lcfg, kv = load_shard(spec, comm, progress=lambda *_: None)  # rank 0 shows the progress
    except Exception as e:  # noqa: BLE001 - rank 0 raises it; this rank waits for the next engine
        store.set(status_key(gen, env.rank), error_text(e).encode())
        return
    store.set(status_key(gen, env.rank), READY.encode())
    print(f"tokentrace rank {env.rank}/{env.world_size}: serving {spec.path.name} (engine {gen}, "
          f"{lcfg.num_heads} of {spec.cfg.num_heads} query heads) on {spec.device}", file=sys.stderr, flush=True)
    serve_steps(comm, model, lcfg, kv, torch.device(spec.device))
