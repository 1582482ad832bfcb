"""The decode engines of the serving process: each a Lane of its own, with
its KV pool, block manager, scheduler (its batch) and kv.pool record, over the one copy of
the model's weights that process holds.

Decode engine 0 is the lane of the LLMEngine that DisaggEngine holds as its decode core (its
scheduler a DecodeScheduler, given through CoreHooks); decode engine j > 0 is built here,
whole: a pool of decode 0's size and a runner over it (PoolView), whose model is a view of
the same weights with its attention layers reading that pool. DisaggEngine steps them in
turn, each step given its lane; nothing is swapped.
They share the process, its device and its cores, the requests table, the tracer and the
step counter (a step number names one decode engine's step). What D > 1 shows is the split:
each request's pages in one pool, its decode steps in one batch; not D times the decode
compute (that takes D devices).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.lane import Lane
from engine.model_runner import ModelRunner
from engine.scheduler import Scheduler, SchedulerOutput
from engine.sequence import Sequence, Status
from engine.trace.kv_pool import KVPoolTracker


class DecodeScheduler(Scheduler):
    """A decode engine's scheduler: a new request goes to the prefill side (`remote`), not
    into the queue; only preempted sequences (recomputed here) ever wait in it."""

    def __init__(self, config: EngineConfig, bm, remote, arriving) -> None:
        super().__init__(config, bm)
        self.remote = remote
        self.arriving = arriving  # () -> the sequences whose pages are on the way here (blocks held for them)

    def add(self, seq: Sequence) -> None:
        self.remote(seq)

    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        if out.out_of_memory and self.arriving():  # those blocks come back (as running requests' or free)
            out.out_of_memory = []
        return out

    def holding(self) -> list[Sequence]:
        return super().holding() + self.arriving()

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.status == Status.WAITING and seq not in self.waiting:  # on the prefill side or its pages on the way
            seq.status, seq.finish_reason = Status.FINISHED, reason
            return
        super().finish(seq, reason)


class PoolView(ModelRunner):
    """A runner over a KV pool of its own, with another runner's model weights (not loaded
    again: ModelRunner.__init__ does not run). No CUDA graphs: a graph holds one pool's
    addresses (cuda_graphs is refused with more than one decode engine)."""

    def __init__(self, base: ModelRunner, kv: torch.Tensor) -> None:
        self.cfg, self.ecfg, self.device, self.dtype = base.cfg, base.ecfg, base.device, base.dtype
        self.weight_dtype, self.use_triton, self.max_model_len = base.weight_dtype, base.use_triton, base.max_model_len
        self.num_blocks, self.block_size = base.num_blocks, base.block_size
        self.kv_cache = kv  # [K/V, layer, block, slot, kv head, head dim], as the base's pool
        self.model = model_over(base.model, kv)


def model_over(model: nn.Module, kv: torch.Tensor) -> nn.Module:
    """The model with its attention layers over this pool: the modules from the root down to
    each attention layer are new objects (copy.copy: the same parameters, buffers and
    tensors), every other module is the model's own. Each copied layer plans its fused C
    calls afresh, over this pool."""
    layers = {id(attn): i for i, attn in enumerate(model.attention_layers())}
    return _copy_towards(model, layers, kv)


def _copy_towards(m: nn.Module, layers: dict[int, int], kv: torch.Tensor) -> nn.Module:
    if not any(id(x) in layers for x in m.modules()):
        return m
    c = copy.copy(m)
    c.__dict__["_modules"] = {name: None if child is None else _copy_towards(child, layers, kv)
                              for name, child in m._modules.items()}
    c.__dict__.pop("_fused_stack", None)  # a DecoderModel's one-call plan (engine/layers/fused.py)
    if "fused" in c.__dict__:
        c.__dict__["fused"] = None  # a DecoderLayer's plan: its own, over this pool
    if id(m) in layers:  # MLA: both views are the one latent
        c.__dict__["k_cache"], c.__dict__["v_cache"] = kv[0, layers[id(m)]], kv[-1, layers[id(m)]]
    return c


def another_lane(first: Lane, config: EngineConfig, index: int, remote, arriving, emit, always: bool) -> Lane:
    """Decode engine `index`: a pool of decode 0's (`first`'s) size, a runner over it, and a block
    manager, scheduler and pool record of its own (no prefix cache: its blocks are received pages).
    emit: the decode core's (None: untraced)."""
    bm = BlockManager(first.runner.num_blocks, config.block_size, False, emit=emit)
    runner = PoolView(first.runner, torch.zeros_like(first.runner.kv_cache))
    return Lane(DecodeScheduler(config, bm, remote, arriving), bm, runner, KVPoolTracker(always=always), index)


def pool_stats(lane: Lane) -> dict:
    """A decode engine's pool, its invariants checked (with the requests whose pages are on the way)."""
    bm, sched = lane.block_manager, lane.scheduler
    bm.check_invariants(sched.holding())
    return {"num_blocks": bm.num_blocks, "free_blocks": bm.num_free_blocks, "running": len(sched.running),
            "waiting": len(sched.waiting)}
