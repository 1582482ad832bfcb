"""The ranks. Rank 0 lives in the engine's process: it keeps the scheduler and the block
tables, and each step broadcasts the batch (token ids, positions, KV slots, block tables)
to ranks 1..N-1, spawned processes (torch.multiprocessing, spawn) that each hold their
shard and their own KV pages for their heads, and run the same forward pass in lockstep;
the all-reduces inside the layers keep them in step. Only rank 0 computes logits (the LM
head is replicated), so nothing else comes back but, for traced requests, the collectives'
timings and, for `full` traces, each rank's heads' attention probabilities. Under torchrun
the ranks 1..N-1 are torchrun's processes instead, running serve_steps() from launch.py.

Failure handling: a worker that dies closes its gloo connections, so rank 0's next
collective fails; rank 0 then also checks the workers' exit codes, stops the others and
raises RankFailedError naming the rank. A worker whose rank 0 disappears (its parent
process gone, or the broadcast failing) exits on its own, so nothing is left behind.
"""
from __future__ import annotations

import os
import signal
import threading
import time
import traceback
import weakref
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.multiprocessing as mp

from engine.trace import capture, logit_lens
from engine.batch import CaptureSpec, ForwardBatch
from engine.config import EngineConfig, ModelConfig
from engine.layers.linear import pack_weights
from engine.config import ProgressFn
from engine.checkpoint.weights import build_model, load_weights
from engine.model_runner import ModelRunner, kv_pool_blocks, _triton_available
from engine.parallel.comm import Comm
from engine.parallel.shard import check_shardable, local_config, placement, shard_model
from engine.scheduler import ScheduledSeq

STARTUP_TIMEOUT_S = 600.0


class RankFailedError(RuntimeError):
    """A rank of a sharded engine died or failed; the engine cannot continue."""


@dataclass
class ShardSpec:
    path: Path
    cfg: ModelConfig
    max_model_len: int
    dtype: torch.dtype
    device: str
    num_blocks: int
    block_size: int
    world_size: int
    expert_parallel: bool
    port: int
    threads: int


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
    kv = torch.zeros(2, cfg.num_layers, spec.num_blocks, spec.block_size, lcfg.num_kv_heads, cfg.head_dim,
                     dtype=spec.dtype, device=device)
    for i, attn in enumerate(model.attention_layers()):
        attn.k_cache, attn.v_cache = kv[0, i], kv[1, i]
    return model, lcfg, kv


def _batch_message(batch: ForwardBatch, want_timings: bool) -> dict:
    # captures: only the attention part travels (each rank scores its own heads' attention)
    caps = [c if c is not None and c.attention_layers else None for c in batch.captures]
    return {"ids": batch.input_ids.tolist(), "pos": batch.positions.tolist(), "slots": batch.slot_mapping.tolist(),
            "starts": batch.query_starts, "ctx": batch.context_lens, "tables": batch.block_tables.tolist(),
            "triton": batch.use_triton, "timings": want_timings,
            "captures": [None if c is None else replace(c, heads=None, moe=False, embed_dims=0) for c in caps]}


def _batch_from_message(m: dict, device: torch.device) -> ForwardBatch:
    t = lambda v, dt=torch.long: torch.tensor(v, dtype=dt, device=device)  # noqa: E731
    return ForwardBatch(input_ids=t(m["ids"]), positions=t(m["pos"]), slot_mapping=t(m["slots"]),
                        query_starts=m["starts"], context_lens=m["ctx"], block_tables=t(m["tables"]),
                        context_lens_t=t(m["ctx"], torch.int32), captures=m["captures"],
                        use_triton=m["triton"])


def local_attention_probs(batch: ForwardBatch, cfg: ModelConfig, kv: torch.Tensor, b: int) -> torch.Tensor:
    """Sequence b's attention probabilities for this rank's heads, every captured layer:
    [L, local heads, rows, keys] (engine/trace/capture.py's computation, on this rank's shard)."""
    spec = batch.captures[b]
    layers = [layer for layer in spec.attention_layers if layer in batch.layer_q]
    end, ctx = batch.query_starts[b + 1], batch.context_lens[b]
    rows = min(end - batch.query_starts[b], spec.max_keys)
    q = torch.stack([batch.layer_q[layer][end - rows:end] for layer in layers])
    k = kv[0].index_select(1, batch.block_tables[b, : -(-ctx // kv.shape[3])])
    k = k.index_select(0, torch.tensor(layers, device=k.device)).flatten(1, 2)
    probs = capture.attention_probs(q, k, ctx, cfg.attention_scale, [cfg.sliding_windows[i] for i in layers])
    return probs[..., max(0, ctx - spec.max_keys):].contiguous()


def gather_attention(batch: ForwardBatch, cfg: ModelConfig, kv: torch.Tensor, comm: Comm) -> dict[int, torch.Tensor]:
    """Every rank's probabilities of every sequence that captures attention, side by side
    by head on every rank: {b: [L, heads, rows, keys]}. Same order of calls on every rank."""
    out = {}
    for b, spec in enumerate(batch.captures):
        if spec is None or not spec.attention_layers:
            continue
        mine = local_attention_probs(batch, cfg, kv, b)
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
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: rank 0 decides
    torch.set_num_threads(spec.threads)
    try:
        comm = Comm.connect("127.0.0.1", spec.port, rank, spec.world_size, torch.device(spec.device))
        model, lcfg, kv = load_shard(spec, comm, progress=lambda *_: None)  # rank 0 shows the progress
        conn.send(("ready", None))
    except BaseException as e:  # noqa: BLE001 - reported to rank 0, which raises it
        conn.send(("error", f"{type(e).__name__}: {e}"))
        os._exit(1)
    serve_steps(comm, model, lcfg, kv, torch.device(spec.device))
    conn.close()
    os._exit(0)


def serve_steps(comm: Comm, model, lcfg: ModelConfig, kv: torch.Tensor, device: torch.device) -> None:
    """A worker rank's loop: rank 0's batches, in lockstep, until its shutdown message
    (returns). Exits the process when rank 0 is gone (2) or a step fails here (1)."""
    with torch.inference_mode():
        while True:
            try:
                msg = comm.broadcast_object(None)
            except Exception:  # rank 0 is gone
                os._exit(2)
            if msg is None:  # shutdown
                return
            try:
                batch = _batch_from_message(msg, device)
                model(batch)
                log = comm.take_log()
                if msg["timings"]:  # the same collectives in the same order as rank 0's run()
                    comm.gather_timings(log)
                if batch.any_capture:
                    gather_attention(batch, lcfg, kv, comm)
            except Exception:
                traceback.print_exc()
                os._exit(1)


class ParallelRunner(ModelRunner):
    """ModelRunner for rank 0 of a sharded model: same interface, plus the workers."""

    def __init__(self, path: Path, cfg: ModelConfig, ecfg: EngineConfig, max_model_len: int,
                 dtype: torch.dtype, device: torch.device, progress: ProgressFn | None = None) -> None:
        n, ep = ecfg.tensor_parallel_size, ecfg.expert_parallel
        check_shardable(cfg, n, ep)
        from engine.parallel import launch
        torchrun = launch.torchrun_env()  # started by torchrun: its other processes are the ranks
        if torchrun is not None:
            launch.check_world(torchrun, n)
        elif device.type == "cuda" and n > torch.cuda.device_count():  # NCCL: one GPU per rank
            raise ValueError(f"tensor_parallel_size={n} needs {n} GPUs; this machine has {torch.cuda.device_count()}")
        self.cfg, self.ecfg, self.device, self.dtype = cfg, ecfg, device, dtype
        self.world_size, self.expert_parallel = n, ep
        self.placement = placement(cfg, n, ep)
        self.local_cfg = local_config(cfg, n, ep)
        self.block_size = ecfg.block_size
        self.num_blocks = kv_pool_blocks(self.local_cfg, ecfg, max_model_len, dtype, device)
        self.use_triton = ecfg.use_triton if ecfg.use_triton is not None else \
            device.type == "cuda" and _triton_available()
        self.procs: list = []
        self.conns: list = []
        self.failed: str | None = None
        self.step_collectives: list[dict] = []  # the last traced step's, per collective
        self._want_timings = False
        self.comm = None
        self.torchrun = torchrun
        if torchrun is not None:
            self._start_external(path, cfg, max_model_len, progress)
            return
        # The store first (without waiting), so the workers know its port.
        import datetime
        import torch.distributed as dist
        store = dist.TCPStore("127.0.0.1", 0, n, True, timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S),
                              wait_for_workers=False)
        threads = max(1, (os.cpu_count() or 1) // n)
        ctx = mp.get_context("spawn")
        for rank in range(1, n):
            spec = ShardSpec(path, cfg, max_model_len, dtype, str(device) if device.type == "cpu" else f"cuda:{rank}",
                             self.num_blocks, ecfg.block_size, n, ep, store.port, threads)
            parent_conn, child_conn = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(rank, spec, os.getpid(), child_conn), daemon=True,
                            name=f"tokentrace-rank{rank}")
            p.start()
            child_conn.close()
            self.procs.append(p)
            self.conns.append(parent_conn)
        self._state = {"in_step": False}  # a step cut short (Ctrl-C) leaves the ranks mid-collective
        self._finalizer = weakref.finalize(self, _stop_workers, self.procs, None, self._state)
        try:
            self.comm = Comm.connect_with_store(store, 0, n, device, STARTUP_TIMEOUT_S)
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _stop_workers, self.procs, self.comm, self._state)
            spec0 = ShardSpec(path, cfg, max_model_len, dtype, str(device), self.num_blocks, ecfg.block_size,
                              n, ep, store.port, threads)
            self.model, _, self.kv_cache = load_shard(spec0, self.comm, progress)
            self._wait_ready()
        except BaseException:
            self.shutdown()
            raise
        self.comm.take_log()

    def _start_external(self, path: Path, cfg: ModelConfig, max_model_len: int, progress: ProgressFn | None) -> None:
        """Under torchrun (engine/parallel/launch.py): the ranks are running already; publish
        the spec in rank 0's store as a new generation and connect to them."""
        from engine.parallel import launch
        n = self.world_size
        spec = ShardSpec(path, cfg, max_model_len, self.dtype, str(self.device), self.num_blocks, self.block_size,
                         n, self.expert_parallel, 0, self.torchrun.threads())
        store, gen = launch.publish(self.torchrun, spec, self)
        self._state = {"in_step": False}
        self._finalizer = weakref.finalize(self, _stop_workers, [], None, self._state)
        try:
            self.comm = Comm.connect_with_store(store, 0, n, self.device, STARTUP_TIMEOUT_S,
                                                prefix=f"tokentrace/gen{gen}")
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _stop_workers, [], self.comm, self._state, True)
            self.model, _, self.kv_cache = load_shard(spec, self.comm, progress)
            if (err := launch.wait_ready(store, gen, n)) is not None:
                self.failed = err  # no shutdown message: a rank that failed would never take part in it
                raise RankFailedError(err)
        except BaseException:
            self.shutdown()
            raise
        self.comm.take_log()

    def _wait_ready(self) -> None:
        for rank, (p, c) in enumerate(zip(self.procs, self.conns), start=1):
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while not c.poll(0.1):
                if not p.is_alive() or time.monotonic() > deadline:
                    raise RankFailedError(f"tensor-parallel rank {rank} exited while loading its shard "
                                          f"(exit code {p.exitcode})")
            status, err = c.recv()
            if status != "ready":
                raise RankFailedError(f"tensor-parallel rank {rank} failed to load its shard: {err}")

    def prepare(self, scheduled: list[ScheduledSeq], captures: list[CaptureSpec | None]) -> ForwardBatch:
        self._want_timings = any(s.seq.traced for s in scheduled)
        return super().prepare(scheduled, captures)

    @torch.inference_mode()
    def run(self, batch: ForwardBatch, token_rows: list[int] | None = None) -> torch.Tensor:
        if self.failed:
            raise RankFailedError(self.failed)
        if self._state["in_step"]:  # the last step was cut short (Ctrl-C caught): the ranks are out of step
            self.failed = "a step was interrupted half way through its collectives; the sharded engine stopped: restart it"
            self.shutdown()
            raise RankFailedError(self.failed)
        self._check_workers()
        want = self._want_timings
        self._want_timings = False
        self._state["in_step"] = True
        try:
            self.comm.broadcast_object(_batch_message(batch, want))
            hidden = self.model(batch)
            log = self.comm.take_log()
            if want:
                per_rank, at = self.comm.gather_timings(log)
                origin = log[0].start + log[0].ms / 1e3  # rank 0's clock when the batch broadcast ended
                self.step_collectives = [{"kind": c.kind, "layer": c.layer, "what": c.what, "bytes": c.bytes,
                                          "ms": [per_rank[r][i] for r in range(self.world_size)],
                                          "start": [origin + at[r][i] / 1e3 for r in range(self.world_size)]}
                                         for i, c in enumerate(log)]
            # attention from every rank's heads (embeddings and MoE routing are here already)
            probs = gather_attention(batch, self.local_cfg, self.kv_cache, self.comm) if batch.any_capture else {}
        except Exception as e:
            self._fail(e)
        self._state["in_step"] = False
        if batch.any_capture:
            specs = batch.captures
            batch.captures = _without_attention(specs)
            capture.collect(batch, self.local_cfg, self.kv_cache)
            batch.captures = specs
            _fill_attention(batch, probs, self.cfg)
        if token_rows is not None:
            hidden = hidden[token_rows]
        # the logit lens's rows too: rank 0 holds the whole residual stream after each all-reduce
        return logit_lens.logits_with_lens(self.model, hidden, batch)

    def _check_workers(self) -> None:
        for rank, p in enumerate(self.procs, start=1):
            if not p.is_alive():
                self._fail(None)

    def _fail(self, err: Exception | None):
        time.sleep(0.2)  # let a dying worker's exit code land
        dead = [(rank, p.exitcode) for rank, p in enumerate(self.procs, start=1) if not p.is_alive()]
        if dead:
            rank, code = dead[0]
            self.failed = (f"tensor-parallel rank {rank} of {self.world_size} died (exit code {code}); "
                           "the sharded engine stopped: restart it")
        else:
            self.failed = f"a collective between the tensor-parallel ranks failed ({type(err).__name__}: {err}); " \
                          "the sharded engine stopped: restart it"
        self.shutdown()
        raise RankFailedError(self.failed) from err

    def trace_events(self) -> list[dict]:
        """The last traced step's collectives (read once)."""
        out, self.step_collectives = self.step_collectives, []
        return out

    def shutdown(self) -> None:
        """Stop the workers (a shutdown message, then terminate what is left)."""
        self._finalizer.detach()
        _stop_workers(self.procs, self.comm if not self.failed else None, self._state, self.torchrun is not None)
        self.failed = self.failed or "this sharded engine was shut down (its worker ranks are stopped)"


def _stop_workers(procs: list, comm: Comm | None, state: dict, external: bool = False) -> None:
    """The shutdown message where the ranks are between steps; else (a failure, a step
    interrupted half way, whose collectives the message would be mistaken for) terminate.
    `external`: torchrun's ranks, not ours to terminate; once stopped, they serve the next engine."""
    if state.get("stopped"):
        return
    state["stopped"] = True
    if comm is not None and not state["in_step"] and (external or any(p.is_alive() for p in procs)):
        try:
            comm.broadcast_object(None)
            for p in procs:
                p.join(timeout=5)
        except Exception:  # noqa: BLE001 - they are terminated below
            pass
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()


def _without_attention(captures: list[CaptureSpec | None]) -> list[CaptureSpec | None]:
    return [None if c is None else replace(c, attention_layers=[]) for c in captures]


def _fill_attention(batch: ForwardBatch, probs: dict[int, torch.Tensor], cfg: ModelConfig) -> None:
    """batch.captured_attention as engine/trace/capture.py writes it, from the gathered probabilities."""
    for b, p in probs.items():
        spec = batch.captures[b]
        layers = [layer for layer in spec.attention_layers if layer in batch.layer_q]
        end, ctx = batch.query_starts[b + 1], batch.context_lens[b]
        rows = min(end - batch.query_starts[b], spec.max_keys)
        if spec.heads is not None:
            p = p[:, spec.heads]
        for layer, lp in zip(layers, torch.round(p.double(), decimals=capture.DECIMALS).tolist()):
            batch.captured_attention.setdefault(layer, {})[b] = {
                "q_start": ctx - rows, "k_start": max(0, ctx - spec.max_keys), "window": cfg.sliding_windows[layer],
                "probs": lp}
