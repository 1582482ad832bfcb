"""The tracing section's watching rows (benchmarks/bench/tracing_watch.py): a `full` stream beside
an untraced one at batch 1 and the settings' batch, in the page's lens setting, every token's,
after the last token and with none, and each capture's cost a token, and the page's own request
on a model with a draft (tracing_page.py), at a tiny size (fast tier)."""
from __future__ import annotations

import math

from app.__main__ import parse_args
from benchmarks.bench.context import QUICK, Bench
from benchmarks.bench.tracing_page import page_k, page_request
from benchmarks.bench.tracing_watch import AT_END, EVERY, LIVE, watch_cost
from engine.llm_engine import LLMEngine
from engine.trace import EventList, Tracer
from tests.tiny import make_checkpoint


def test_watching_rows_at_both_batches_with_each_captures_cost(checkpoint):
    b = Bench(checkpoint("mixtral"), None, "cpu", QUICK)
    sink = EventList()
    tracer = Tracer(sink)
    engine = LLMEngine(b.model, device="cpu", tracer=tracer)
    watch_cost(b, engine, tracer, sink, 4)  # 2 rounds of 9 variants, 4 tokens each, at batch 1 and 2
    watch = {r.name: r for r in b.rows if r.name.startswith("watching, ")}
    for batch in (1, 2):  # QUICK's batch: 2
        for name in (LIVE, EVERY, AT_END, "full, no lens"):
            r = watch[f"watching, batch {batch}, {name}: stream tok/s"]
            assert r.value > 0 and r.baseline > 0 and "against untraced" in r.note and "load average" in r.note
        for what in ("logit lens", "attention", "embedding rows", "MoE routing and the pass's bookkeeping",
                     "schedule, KV fills, sampling, kv.pool events"):
            assert math.isfinite(watch[f"watching, batch {batch}, {what}: ms a token"].value)
        # and by the engine's own clock: every kind a `full` trace of a MoE model does (no draft: no rounds)
        for kind in ("schedule", "kv fills", "sampling", "logit lens", "embedding rows", "attention",
                     "moe routing", "kv.pool"):
            assert watch[f"watching, batch {batch}, {kind}, by the engine's clock: ms a token"].value > 0
        assert f"watching, batch {batch}, speculation, by the engine's clock: ms a token" not in watch
    # every traced run's trace ended: nothing waits, and the engine is back in the page's setting
    assert not engine.step_trace.lenses.pending and not engine.step_trace.lenses.ended
    assert engine.capture.lens_live_seconds == 0.2


def test_the_pages_request_rows_run_with_its_draft_at_the_pages_k(checkpoint, tmp_path):
    """A model served with a draft: the page's Send is speculative at the app's default k, and its
    rows say so; a model without one adds none (its plain rows are the page's request)."""
    draft = make_checkpoint("llama", tmp_path / "draft", seed=3, num_layers=1)
    b = Bench(checkpoint("mixtral"), draft, "cpu", QUICK)
    page_request(b, 4)
    k = page_k()
    assert k == parse_args([]).num_speculative_tokens >= 1
    rows = {r.name: r for r in b.rows}
    for batch in (1, 2):
        r = rows[f"watching, batch {batch}, the page's request (its draft model, k={k}), {LIVE}: stream tok/s"]
        assert r.value > 0 and r.baseline > 0 and "round by round" in r.note
    plain = Bench(checkpoint("mixtral"), None, "cpu", QUICK)
    page_request(plain, 4)
    assert plain.rows == []
