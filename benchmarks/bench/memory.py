"""Memory: the KV pool's peak use against its size, the process's peak resident memory."""
from __future__ import annotations

import resource

import torch

from benchmarks.bench.context import Bench
from benchmarks.bench.timing import greedy


def memory(b: Bench) -> None:
    """The KV pool's peak use while the mixed requests run together, against its size;
    the process's peak resident memory over the whole run (transformers included)."""
    prompts, outs = b.mixed()
    engine = b.engine(max_num_seqs=len(prompts))
    for p, o in zip(prompts, outs):
        engine.add_request(p, greedy(o))
    bm, peak = engine.block_manager, 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, bm.num_blocks - bm.num_free_blocks)
    per_block = engine.runner.kv_cache_bytes / engine.runner.num_blocks
    b.add("memory", f"KV pool, peak in use ({len(prompts)} mixed requests)", peak * per_block / 2**20, "MiB",
          engine.runner.kv_cache_bytes / 2**20,
          f"baseline: the pool, {engine.runner.num_blocks} blocks x {engine.config.block_size} tokens")
    b.add("memory", "process peak RSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "MiB")
    if b.cuda:
        b.add("memory", "CUDA peak allocated", torch.cuda.max_memory_allocated() / 2**20, "MiB")
