"""Rank 0 of a sharded engine: the ModelRunner that LLMEngine builds for
tensor_parallel_size > 1 or expert_parallel. Rank 0 lives in the engine's process: it
keeps the scheduler and the block tables, and each step broadcasts the batch (token ids,
positions, KV slots, block tables) to ranks 1..N-1 (worker_main), which run
the same forward pass on their shards in lockstep. Its ranks are processes it spawns
(torch.multiprocessing, spawn), or, under torchrun, torchrun's (see rendezvous).

Failure handling: a worker that dies closes its gloo connections, so rank 0's next
collective fails; rank 0 then also checks the workers' exit codes, stops the others and
raises RankFailedError naming the rank. shutdown() sends the shutdown message, joins the
workers (terminating what is left) and closes their pipes: nothing is left behind.
"""
from __future__ import annotations

import datetime
import functools
import os
import time
import weakref
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from engine.trace import logit_lens
from engine.batch import ForwardBatch
from engine.config import EngineConfig, ModelConfig, ProgressFn
from engine.kernels import triton_available
from engine.model_runner import ModelRunner, kv_pool_blocks
from engine.parallel.comm import Comm
from engine.parallel.protocol import SHUTDOWN, STARTUP_TIMEOUT_S, ShardSpec, encode_batch, group_prefix
from engine.parallel.rendezvous import check_world, publish, torchrun_env, wait_ready
from engine.parallel.spawn import check_alive, start_process, wait_loaded
from engine.parallel.shard import check_shardable, local_config, placement
from engine.parallel.worker import gather_attention, load_shard, worker_main
from engine.sequence import ScheduledSeq
from engine.trace.capture import AttentionCapture, CaptureSpec, PassCapture, collect, key_window


class RankFailedError(RuntimeError):
    """A rank of a sharded engine died or failed; the engine cannot continue."""


class ParallelRunner(ModelRunner):
    """ModelRunner for rank 0 of a sharded model: same interface, plus the workers."""

    def __init__(self, path: Path, cfg: ModelConfig, ecfg: EngineConfig, max_model_len: int,
                 dtype: torch.dtype, device: torch.device, progress: ProgressFn | None = None) -> None:
        n, ep = ecfg.tensor_parallel_size, ecfg.expert_parallel
        check_shardable(cfg, n, ep)
        torchrun = torchrun_env()  # started by torchrun: its other processes are the ranks
        if torchrun is not None:
            check_world(torchrun, n)
        elif device.type == "cuda" and n > torch.cuda.device_count():  # NCCL: one GPU per rank
            raise ValueError(f"tensor_parallel_size={n} needs {n} GPUs; this machine has {torch.cuda.device_count()}")
        self.cfg, self.ecfg, self.device, self.dtype = cfg, ecfg, device, dtype
        self.world_size, self.expert_parallel = n, ep
        self.placement = placement(cfg, n, ep)
        self.local_cfg = local_config(cfg, n, ep)
        self.block_size = ecfg.block_size
        self.num_blocks = kv_pool_blocks(self.local_cfg, ecfg, max_model_len, dtype, device)
        self.use_triton = ecfg.use_triton if ecfg.use_triton is not None else \
            device.type == "cuda" and triton_available()
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
        store = dist.TCPStore("127.0.0.1", 0, n, True, timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S),
                              wait_for_workers=False)
        threads = max(1, (os.cpu_count() or 1) // n)
        for rank in range(1, n):
            spec = ShardSpec(path, cfg, max_model_len, dtype, str(device) if device.type == "cpu" else f"cuda:{rank}",
                             self.num_blocks, ecfg.block_size, n, ep, store.port, threads)
            start_process(worker_main, (rank, spec, os.getpid()), f"tokentrace-rank{rank}", self.procs, self.conns)
        self._state = {"in_step": False}  # a step cut short (Ctrl-C) leaves the ranks mid-collective
        self._finalizer = weakref.finalize(self, _stop_workers, self.procs, self.conns, None, self._state)
        try:
            self.comm = Comm.connect_watching(store, 0, n, device, STARTUP_TIMEOUT_S, self._check_started)
            # not a bound method: the finalizer below holds comm, and must not hold self
            self.comm.watch = functools.partial(check_alive, self.procs, RankFailedError,
                                                "tensor-parallel rank {n} exited", first=1)
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _stop_workers, self.procs, self.conns, self.comm, self._state)
            spec0 = ShardSpec(path, cfg, max_model_len, dtype, str(device), self.num_blocks, ecfg.block_size,
                              n, ep, store.port, threads)
            self.model, _, self.kv_cache = load_shard(spec0, self.comm, progress)
            self._wait_ready()
        except BaseException:
            self.shutdown()
            raise
        self.comm.take_log()

    def _start_external(self, path: Path, cfg: ModelConfig, max_model_len: int, progress: ProgressFn | None) -> None:
        """Under torchrun (rendezvous): the ranks are running already; publish
        the spec in rank 0's store as a new generation and connect to them."""
        n = self.world_size
        spec = ShardSpec(path, cfg, max_model_len, self.dtype, str(self.device), self.num_blocks, self.block_size,
                         n, self.expert_parallel, 0, self.torchrun.threads())
        store, gen = publish(self.torchrun, spec, self)
        self._state = {"in_step": False}
        self._finalizer = weakref.finalize(self, _stop_workers, [], [], None, self._state)
        try:
            self.comm = Comm.connect_with_store(store, 0, n, self.device, STARTUP_TIMEOUT_S,
                                                prefix=group_prefix(gen))
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _stop_workers, [], [], self.comm, self._state, True)
            self.model, _, self.kv_cache = load_shard(spec, self.comm, progress)
            if (err := wait_ready(store, gen, n)) is not None:
                self.failed = err  # no shutdown message: a rank that failed would never take part in it
                raise RankFailedError(err)
        except BaseException:
            self.shutdown()
            raise
        self.comm.take_log()

    def _check_started(self) -> None:
        """While the group connects: a rank whose process is gone will never join it."""
        check_alive(self.procs, RankFailedError, "tensor-parallel rank {n} exited before it joined the process group",
                    first=1)

    def _wait_ready(self) -> None:
        """Each worker's report that its shard is loaded (STARTUP_TIMEOUT_S for each)."""
        wait_loaded(self.procs, self.conns, STARTUP_TIMEOUT_S, RankFailedError,
                    exited="tensor-parallel rank {n} exited while loading its shard",
                    failed="tensor-parallel rank {n} failed to load its shard", first=1, per_process=True)

    def prepare(self, scheduled: list[ScheduledSeq]) -> ForwardBatch:
        self._want_timings = any(s.seq.traced for s in scheduled)
        return super().prepare(scheduled)

    @torch.inference_mode()
    def run(self, batch: ForwardBatch, token_rows: list[int] | None = None,
            capture: PassCapture | None = None) -> torch.Tensor:
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
            self.comm.broadcast_object(encode_batch(batch, capture, want))
            hidden = self.model(batch, capture)
            log = self.comm.take_log()
            if want:
                per_rank, at = self.comm.gather_timings(log)
                origin = log[0].start + log[0].ms / 1e3  # rank 0's clock when the batch broadcast ended
                self.step_collectives = [{"kind": c.kind, "layer": c.layer, "what": c.what, "bytes": c.bytes,
                                          "ms": [per_rank[r][i] for r in range(self.world_size)],
                                          "start": [origin + at[r][i] / 1e3 for r in range(self.world_size)]}
                                         for i, c in enumerate(log)]
            # attention from every rank's heads (embeddings and MoE routing are here already)
            probs = {} if capture is None else gather_attention(batch, capture, self.local_cfg, self.kv_cache,
                                                                self.comm)
        except Exception as e:
            self._fail(e)
        self._state["in_step"] = False
        if capture is not None:
            specs = capture.specs
            capture.specs = _without_attention(specs)
            collect(capture, batch, self.local_cfg, self.kv_cache)
            capture.specs = specs
            _fill_attention(batch, capture, probs, self.cfg)
        if token_rows is not None:
            hidden = hidden[token_rows]
        # the logit lens's rows too: rank 0 holds the whole residual stream after each all-reduce
        return logit_lens.logits_with_lens(self.model, hidden, capture)

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
        """Stop the workers (a shutdown message, then terminate what is left) and close their pipes."""
        self._finalizer.detach()
        _stop_workers(self.procs, self.conns, self.comm if not self.failed else None, self._state,
                      self.torchrun is not None)
        self.failed = self.failed or "this sharded engine was shut down (its worker ranks are stopped)"


def _stop_workers(procs: list, conns: list, comm: Comm | None, state: dict, external: bool = False) -> None:
    """The shutdown message where the ranks are between steps; else (a failure, a step
    interrupted half way, whose collectives the message would be mistaken for) terminate.
    Every process is joined (reaped) and every pipe closed.
    `external`: torchrun's ranks, not ours to terminate; once stopped, they serve the next engine."""
    if state.get("stopped"):
        return
    state["stopped"] = True
    if comm is not None and not state["in_step"] and (external or any(p.is_alive() for p in procs)):
        try:
            comm.broadcast_object(SHUTDOWN)
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
    for c in conns:
        c.close()


def _without_attention(captures: list[CaptureSpec | None]) -> list[CaptureSpec | None]:
    return [None if c is None else replace(c, attention_layers=[]) for c in captures]


def _fill_attention(batch: ForwardBatch, capture: PassCapture, probs: dict[int, torch.Tensor],
                    cfg: ModelConfig) -> None:
    """capture.attention as trace.capture writes it, from the gathered probabilities
    (the trace events encode it the same way as one device's)."""
    for b, p in probs.items():
        spec = capture.specs[b]
        layers = [layer for layer in spec.attention_layers if layer in capture.layer_q]
        end, ctx = batch.query_starts[b + 1], batch.context_lens[b]
        rows = min(end - batch.query_starts[b], spec.max_keys)
        if spec.heads is not None:
            p = p[:, spec.heads]
        k_head, k_start = key_window(ctx, spec.max_keys, spec.first_keys)
        capture.attention[b] = AttentionCapture(layers, [cfg.sliding_windows[layer] for layer in layers],
                                                ctx - rows, k_start, p.float(), k_head)
