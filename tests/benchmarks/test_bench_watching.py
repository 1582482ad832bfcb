"""The tracing section's watching rows (benchmarks/bench/tracing_watch.py): a `full` stream beside
an untraced one at batch 1 and the settings' batch, and each capture's cost a token, at a tiny size."""
from __future__ import annotations

import math

import pytest

from benchmarks.bench.context import QUICK, Bench
from benchmarks.bench.tracing_watch import watch_cost
from engine.llm_engine import LLMEngine
from engine.trace import EventList, Tracer


@pytest.mark.slow  # ~50 runs of a tiny model (~10 s of CPU)
def test_watching_rows_at_both_batches_with_each_captures_cost(checkpoint):
    b = Bench(checkpoint("mixtral"), None, "cpu", QUICK)
    sink = EventList()
    tracer = Tracer(sink)
    watch_cost(b, LLMEngine(b.model, device="cpu", tracer=tracer), tracer, sink, 2 * QUICK.new_tokens)
    rows = b.rows
    watch = {r.name: r for r in rows if r.name.startswith("watching, ")}
    for batch in (1, 2):  # QUICK's batch: 2
        for name in ("full (the page's: every lens after its step)", "full, lens at the finish"):
            r = watch[f"watching, batch {batch}, {name}: stream tok/s"]
            assert r.baseline > 0 and "against untraced" in r.note and "load average" in r.note
        for what in ("logit lens", "attention", "embedding rows", "MoE routing and the pass's bookkeeping",
                     "schedule, KV fills, sampling, kv.pool events"):
            assert math.isfinite(watch[f"watching, batch {batch}, {what}: ms a token"].value)
