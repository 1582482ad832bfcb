"""What rank 0 and the worker ranks say to each other.

Start-up: rank 0 gives each rank a ShardSpec (what to load); the rank answers READY once
its shard is loaded, or the error that stopped it. A spawned rank gets its spec as its
process's argument and answers over a pipe; torchrun's ranks read it from the store, under
one generation per engine (spec_key), and answer there (status_key); rank 0 waits at most
STARTUP_TIMEOUT_S. Steps: rank 0 broadcasts each batch, encoded by encode_batch (plain
lists, no tensors: rank 0 and the ranks may sit on different devices); SHUTDOWN instead of
a batch ends a rank's loop. Under torchrun, EXIT as the next generation ends the rank's
process, which says goodbye (bye_key) before it exits.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.batch import ForwardBatch
from engine.config import ModelConfig
from engine.trace.capture import PassCapture

STARTUP_TIMEOUT_S = 600.0  # loading a shard: the whole checkpoint is read on every rank
READY = "ready"  # a rank's answer once its shard is loaded (anything else is its error)
SHUTDOWN = None  # the step message that ends a rank's loop
EXIT = b"exit"  # under torchrun: the next generation is none, the ranks' processes finish


@dataclass
class ShardSpec:
    """What a rank loads: the checkpoint, how it is split, and its KV pool's size."""
    path: Path
    cfg: ModelConfig
    max_model_len: int
    dtype: torch.dtype
    device: str
    num_blocks: int
    block_size: int
    world_size: int
    expert_parallel: bool
    port: int  # rank 0's store (spawned ranks; 0 under torchrun, whose store they know)
    threads: int


def error_text(e: BaseException) -> str:
    """An error as a rank reports it to rank 0."""
    return f"{type(e).__name__}: {e}"


# --- the torchrun store's keys (engine/parallel/rendezvous.py) --------------------------------
def spec_key(gen: int) -> str:
    return f"gen{gen}"


def status_key(gen: int, rank: int) -> str:
    return f"gen{gen}/rank{rank}"


def bye_key(rank: int) -> str:
    return f"bye{rank}"


def group_prefix(gen: int) -> str:
    """The process group's keys of generation gen, beside the other engines' in the one store."""
    return f"tokentrace/gen{gen}"


# --- the step message --------------------------------------------------------------------------
def encode_batch(batch: ForwardBatch, capture: PassCapture | None, want_timings: bool) -> dict:
    # captures: only the attention part travels (each rank scores its own heads' attention)
    caps = [] if capture is None else [c if c is not None and c.attention_layers else None for c in capture.specs]
    return {"ids": batch.input_ids.tolist(), "pos": batch.positions.tolist(), "slots": batch.slot_mapping.tolist(),
            "starts": batch.query_starts, "ctx": batch.context_lens, "tables": batch.block_tables.tolist(),
            "triton": batch.use_triton, "timings": want_timings,
            "captures": [None if c is None else replace(c, heads=None, moe=False, embed_dims=0) for c in caps]}


def decode_batch(m: dict, device: torch.device) -> tuple[ForwardBatch, PassCapture | None]:
    t = lambda v, dt=torch.long: torch.tensor(v, dtype=dt, device=device)  # noqa: E731
    batch = ForwardBatch(input_ids=t(m["ids"]), positions=t(m["pos"]), slot_mapping=t(m["slots"]),
                         query_starts=m["starts"], context_lens=m["ctx"], block_tables=t(m["tables"]),
                         context_lens_t=t(m["ctx"], torch.int32), use_triton=m["triton"])
    return batch, PassCapture.of(m["captures"])


def wants_timings(m: dict) -> bool:
    """Whether rank 0 gathers the step's collectives' timings after the pass (a traced request)."""
    return m["timings"]
