"""The decode engines of the serving process: each its own KV pool, block manager, scheduler
(its batch) and kv.pool record, over the one copy of the model's weights that process holds.

DisaggEngine is an LLMEngine; with D decode engines it steps them in turn, pointing its
block manager, scheduler, pool tracker and the model's KV cache at each one's before it
runs that one's step (`DecodeLane.use`). They share the process, its device and its cores,
the requests table, the tracer and the step counter (a step number names one decode
engine's step). What D > 1 shows is the split: each request's pages in one pool, its
decode steps in one batch; not D times the decode compute (that takes D devices).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.scheduler import Scheduler, SchedulerOutput
from engine.sequence import Sequence, Status
from engine.trace.kv_pool import KVPoolTracker


class DecodeScheduler(Scheduler):
    """A decode engine's scheduler: a new request goes to the prefill side (`remote`), not
    into the queue; only preempted sequences (recomputed here) ever wait in it."""

    def __init__(self, config: EngineConfig, bm, remote, receiving) -> None:
        super().__init__(config, bm)
        self.remote = remote
        self.receiving = receiving  # () -> whether blocks are held here for pages on the way

    def add(self, seq: Sequence) -> None:
        self.remote(seq)

    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        if out.out_of_memory and self.receiving():  # those blocks come back (as running requests' or free)
            out.out_of_memory = []
        return out

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.status == Status.WAITING and seq not in self.waiting:  # on the prefill side or its pages on the way
            seq.status, seq.finish_reason = Status.FINISHED, reason
            return
        super().finish(seq, reason)


@dataclass
class DecodeLane:
    """Decode engine `index`: what it owns, and what it borrows from the engine while it steps."""
    index: int
    block_manager: BlockManager
    scheduler: DecodeScheduler
    kv: torch.Tensor  # [K/V, layer, block, slot, kv head, head dim], as the runner's pool
    pool_trace: KVPoolTracker
    plans: list | None = None  # its layers' fused C-call plans (engine/layers/fused.py), kept between turns

    def use(self, engine) -> None:
        """Point the engine (and its model's attention layers) at this decode engine's parts."""
        prev, engine.lane = engine.lane, self
        engine.block_manager, engine.scheduler, engine._pool_trace = self.block_manager, self.scheduler, self.pool_trace
        runner = engine.runner
        if runner.kv_cache is not self.kv:
            runner.kv_cache = self.kv
            for i, attn in enumerate(runner.model.attention_layers()):
                attn.k_cache, attn.v_cache = self.kv[0, i], self.kv[-1, i]
            # a layer's plan holds its pool's addresses (checked before each use, rebuilt when they
            # differ): each decode engine keeps its own, instead of a rebuild at every turn
            layers = runner.model.model.layers
            if prev is not None:
                prev.plans = [layer.fused for layer in layers]
            for layer, plan in zip(layers, self.plans or [None] * len(layers)):
                layer.fused = plan


def first_lane(engine, remote, receiving) -> DecodeLane:
    """Decode engine 0: the parts LLMEngine built, its scheduler a DecodeScheduler."""
    return DecodeLane(0, engine.block_manager, DecodeScheduler(engine.config, engine.block_manager, remote, receiving),
                      engine.runner.kv_cache, engine._pool_trace)


def another_lane(engine, index: int, remote, receiving, always: bool) -> DecodeLane:
    """Decode engine `index`: a pool of decode 0's size and a block manager, scheduler and
    pool record of its own (no prefix cache: its blocks are received pages)."""
    bm = BlockManager(engine.runner.num_blocks, engine.config.block_size, False,
                      emit=engine._emit if engine.tracer is not None else None)
    kv = torch.zeros_like(engine.runner.kv_cache)
    return DecodeLane(index, bm, DecodeScheduler(engine.config, bm, remote, receiving), kv,
                      KVPoolTracker(always=always))
