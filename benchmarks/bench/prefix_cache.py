"""Time to first token with a long system prompt cached against not cached."""
from __future__ import annotations

import statistics

from benchmarks.bench.context import Bench
from benchmarks.bench.timing import greedy, run_engine


def prefix_cache(b: Bench) -> None:
    s = b.settings
    system = (b.prompts[5] * 64)[:s.system_prompt_tokens]
    engine = b.engine(max_num_batched_tokens=4096)
    cold, warm = [], []
    for i in range(s.repeats):
        engine.block_manager.cached.clear()  # forget everything: a cold start
        cold.append(next(iter(run_engine(engine, [system + [11 + i]], [greedy(1)]).values()))["ttft"])
        warm.append(next(iter(run_engine(engine, [system + [12 + i]], [greedy(1)]).values()))["ttft"])
    b.add("prefix caching", f"TTFT, {len(system)}-token system prompt cached", statistics.median(warm) * 1e3,
          "ms", statistics.median(cold) * 1e3, "baseline: not cached")
