"""A lane: the parts one batch runs on. Its scheduler (the queue and the batch), its block
manager (the block tables over its KV pool), the runner that computes the batch over that
pool, and the record of the pool's last kv.pool event.

An LLMEngine has one lane; a disaggregated engine's decode side has one per decode engine
(engine.disagg.lanes), all over one copy of the weights. Each lane is built whole and
keeps its parts; the engine's step takes the lane it steps (LLMEngine.step_lane).

CoreHooks: what an engine built around an LLMEngine (DisaggEngine holds one as its decode
core, PrefillEngine too) changes of that engine's loop, given when it is built: lane 0's
scheduler, the lane a request is in, a stamp on every event, when a token ends a request and
a finish kept back. Nothing is overridden or swapped afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from engine.block_manager import BlockManager
from engine.info import EngineLoad
from engine.model_runner import ModelRunner
from engine.output_processor import OutputProcessor
from engine.outputs import TokenOutput
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.step_pass import EngineStats
from engine.trace.events import Event
from engine.trace.kv_pool import KVPoolTracker


@dataclass(frozen=True)
class Lane:
    scheduler: Scheduler
    block_manager: BlockManager
    runner: ModelRunner  # the model over this lane's KV pool (runner.kv_cache)
    pool_trace: KVPoolTracker  # what the last kv.pool of this pool said
    index: int = 0  # which decode engine (a disaggregated engine's); 0 for an LLMEngine's one


@dataclass(frozen=True)
class CoreHooks:
    """An LLMEngine's loop as an engine around it needs it (each None: the LLMEngine's own way)."""
    new_scheduler: Callable[[BlockManager], Scheduler] | None = None  # lane 0's scheduler, over its blocks
    lane_for: Callable[[Sequence], Lane] | None = None  # the lane a request is in (an abort's finish frees it there)
    stamp: Callable[[Event], Event] | None = None  # every event, before the tracer (say which engine wrote it)
    output_processor: type[OutputProcessor] | None = None  # when a token ends a request (a prefill engine's: the first)
    hold: Callable[[Sequence, str, int | None], TokenOutput | None] | None = None  # a finish kept back: its output


def lane_load(lane: Lane, step_count: int, stats: EngineStats, num_aborted: int) -> EngineLoad:
    """LLMEngine.load: the lane's batch and pool, and the engine's counts."""
    bm, sched, st = lane.block_manager, lane.scheduler, stats
    cached = bm.num_free_cached_blocks
    return EngineLoad(len(sched.running), len(sched.waiting), bm.num_blocks - bm.num_free_blocks, cached,
                      bm.num_free_blocks - cached, step_count, st.target_passes, st.generated_tokens, num_aborted,
                      st.prefix_queried_tokens, st.prefix_hit_tokens, st.spec_proposed, st.spec_accepted)
