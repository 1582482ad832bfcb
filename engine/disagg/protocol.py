"""What the decode side (the serving process, rank 0) and each prefill engine (prefill k is
rank k + 1 of a 1 + P process group) say; each prefill engine has a pipe of its own.

Decode -> prefill, over the pipe:
  ADD (request_id, prompt ids, params, trace level)   prefill this request
  PULL (request_id, tag)      blocks are ready here and a recv is posted: send its KV now
  DROP (request_id)           the request ended here (abort, disconnect): free its blocks
  STOP_CAPTURES (request_id)  its trace passed its reader's byte cap
  STATS                       the prefill pool's numbers (tests check nothing leaked)
  SHUTDOWN (None)             finish
Prefill -> decode, over the pipe:
  EVENTS ([(type, request_id, step, data)])   the prefill engine's trace events
  READY "prefilled" (request_id, Handover)   the prompt is computed and its first token drawn
  SENT (request_id, tag, Wire)   the KV pages went out on torch.distributed
  FAILED (request_id, text)      the prefill engine refused the request
  STATS (dict)
The KV pages themselves go over torch.distributed send/recv with the PULL's tag; once they
are in, the decode side's trace gets the kv.transfer event (kv_transfer_event).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.trace import CaptureConfig

ADD, PULL, DROP, STOP_CAPTURES, STATS = "add", "pull", "drop", "stop_captures", "stats"
EVENTS, READY, SENT, FAILED = "events", "prefilled", "sent", "failed"
SHUTDOWN = None
DECODE_RANK = 0  # every decode engine lives in the serving process: they share rank 0 (distinct tags)


def prefill_rank(index: int) -> int:
    """Prefill engine `index`'s torch.distributed rank."""
    return 1 + index


def engine_name(role: str, index: int) -> str:
    """How events, the Perfetto export and the page name an engine: "prefill 1", "decode 0"."""
    return f"{role} {index}"

HANDOVER = "handover"  # the prefill side's finish reason for a request it passes on

# The prefill side's events that the decode side forwards (with engine="prefill" and its
# engine_index): its steps, its pool and blocks, its captures and the first token's draw. Not
# its arrival, tokens or finish: the decode side emits those once, for the whole request.
DROPPED_EVENTS = ("request.arrive", "tokenize", "token", "finish", "trace.truncated")
PREFILL_POOL_EVENT = "kv.prefill_pool"  # the prefill engine's kv.pool, renamed: another pool
# decode engines after the first: their kv.pool renamed too (the page's KV panel folds one pool,
# decode 0's: block ids of two pools in one grid would say nothing)
DECODE_POOL_EVENT = "kv.decode_pool"


@dataclass
class PrefillSpec:
    """What the prefill process builds: the engine's own arguments, and where rank 0 is."""
    model: Path
    device: str
    dtype: torch.dtype
    config: EngineConfig
    capture: CaptureConfig
    trace: bool  # a tracer on the prefill side (the decode side has one)
    kv_pool_events: str
    port: int  # rank 0's TCPStore
    threads: int
    index: int = 0  # prefill engine `index`: rank prefill_rank(index)
    world_size: int = 2  # 1 + the number of prefill engines


@dataclass
class Handover:
    """A request whose prompt the prefill side computed: its first token and what the decode
    side needs to go on from there (the generator's state: seeded draws continue)."""
    token: int
    num_tokens: int  # the prompt's tokens, all in the KV pages
    blocks: list[int]  # the prefill side's block ids
    finished: bool  # the first token ended it (a stop, max_tokens 1): no pages to send
    generator_state: torch.Tensor | None
    logprobs: object | None  # the first token's TokenLogprob, when asked for
    prompt_logprobs: dict = field(default_factory=dict)
    num_cached_tokens: int = 0  # prefix-cache hits on the prefill side
    first_scheduled_time: float = 0.0  # perf_counter (one clock for both processes on a machine)
    prefill_done_time: float = 0.0
    first_token_time: float = 0.0  # when the prefill side drew it


@dataclass
class Wire:
    """One transfer as the prefill side timed it."""
    bytes: int
    queue_ms: float  # first token drawn -> the send began (waiting for the decode side's blocks)
    wire_ms: float  # the send itself
    start: float  # perf_counter when the send began
    backend: str  # "gloo" | "nccl"
    pool_blocks: int = 0  # the prefill pool after the send freed the request's blocks there
    pool_free: int = 0
    pool_cached: int = 0


def kv_transfer_event(seq, h: Handover, wire: Wire, source: int, lane: int, pages: torch.Tensor, num_layers: int,
                      pools: list[dict], block_size: int):
    """kv.transfer: one request's pages (received into `pages`), prefill engine `source`'s pool
    -> decode engine `lane`'s, and every engine's pool then (the page draws them from this event alone)."""
    now = time.perf_counter()
    src, dst = engine_name("prefill", source), engine_name("decode", lane)
    by_name = {p["engine"]: {k: v for k, v in p.items() if k != "engine"} for p in pools}
    return "kv.transfer", seq.request_id, {
        "src": src, "dst": dst, "src_rank": prefill_rank(source), "dst_rank": DECODE_RANK,
        "backend": wire.backend, "tokens": h.num_tokens,
        "num_blocks": len(h.blocks), "src_blocks": list(h.blocks), "dst_blocks": list(seq.block_table),
        "bytes": wire.bytes, "bytes_per_token": pages[:, :, 0, 0].numel() * pages.element_size(),
        "layers": list(range(num_layers)), "queue_ms": wire.queue_ms, "wire_ms": wire.wire_ms,
        "start": wire.start, "handover_ms": (now - h.first_token_time) * 1e3,
        "prefill_ms": (h.prefill_done_time - h.first_scheduled_time) * 1e3, "cached_tokens": h.num_cached_tokens,
        "src_pool": by_name[src], "dst_pool": by_name[dst], "pools": pools,
        "block_size": block_size}
