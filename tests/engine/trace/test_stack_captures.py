"""A `full` trace's pass through the one-call layer stack (engine/layers/fused.py stack_forward,
cpu_layer.c tt_decode_stack with its capture argument) keeps exactly what the layers one by one
keep: every event of a traced run equal, value for value (timings aside), with the logit lens
on rows that are all the batch and on rows that are a part of it, and a speculative verify pass."""
from __future__ import annotations

import pytest

from engine.layers import fused
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.trace import EventList, Tracer, pass_probs
from engine.trace.tracer import CaptureConfig

TIMINGS = {"schedule.step": {"start", "schedule_seconds", "sample_seconds", "forward_seconds"},
           "schedule.traced": {"trace_seconds", "lens_seconds"},
           "token": {"t", "latency"}, "tokenize": {"seconds"}, "request.arrive": {"tokenized_at"}}


@pytest.fixture(autouse=True)
def kernels(cpu_kernels_switch):
    cpu_kernels_switch(True)  # skips without a compiler (fails where CI requires the kernels)


def _events(path, draft: str | None, levels: list[str], bounds: dict | None = None) -> list[dict]:
    sink = EventList()
    # the lenses at the finish: when a lens batch runs must not hang on the machine's speed
    engine = LLMEngine(path, device="cpu", tracer=Tracer(sink), draft=draft,
                       capture=CaptureConfig(lens_live_seconds=None, **(bounds or {})))
    for i, level in enumerate(levels):  # a batch of them: the lens rows are all the batch only alone
        engine.add_request(list(range(5 + i, 17 + 2 * i)), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                           trace_level=level, request_id=f"r{i}")
    while engine.has_unfinished_requests():
        engine.step()
    out = []
    for e in sink.events:
        d = {k: v for k, v in e.to_dict().items() if k != "ts" and k not in TIMINGS.get(e.type, ())}
        if e.type == "finish":  # its metrics are timings
            d = {k: d[k] for k in ("type", "request_id", "reason", "text", "usage")}
        out.append(d)
    return out


@pytest.mark.parametrize("arch, draft, levels", [
    ("llama", None, ["full"]),  # alone: every row a lens row
    ("mixtral", None, ["full", "basic", "full"]),  # MoE routing from the stack; lens rows a part of the batch
    ("gemma3", None, ["full", "off"]),  # local and global RoPE tables, windows, sandwich norms
    ("llama", "ngram", ["full"]),  # verify passes: k + 1 lens rows of one sequence
])
def test_the_stack_keeps_what_the_layers_one_by_one_keep(checkpoint, monkeypatch, arch, draft, levels):
    _same_both_ways(checkpoint, monkeypatch, arch, draft, levels)


@pytest.mark.parametrize("arch, draft", [("llama", None), ("gemma3", None), ("llama", "ngram")])
def test_the_pass_writes_bounded_attention_as_collect_reads_it(checkpoint, monkeypatch, arch, draft):
    """The stack's attention writes the probabilities itself (engine/trace/pass_probs.py): with
    fewer key columns than keys (the first ones, a gap, the recent ones), fewer rows than a prefill
    chunk has, some layers and some heads, as collect() computes them after a pass by layer."""
    bounds = {"max_keys": 6, "first_keys": 2, "attention_layers": [1, 0], "heads": [3, 0, 2]}
    _same_both_ways(checkpoint, monkeypatch, arch, draft, ["full", "full"], bounds)


def _same_both_ways(checkpoint, monkeypatch, arch, draft, levels, bounds=None):
    calls, planned = [], []
    real, plan = fused.stack_forward, pass_probs.plan
    monkeypatch.setattr(fused, "stack_forward",
                        lambda st, x, b, m, capture=None: calls.append(capture is not None) or real(st, x, b, m, capture))
    monkeypatch.setattr(pass_probs, "plan", lambda *a: planned.append(plan(*a)) or planned[-1])
    one_call = _events(checkpoint(arch), draft, levels, bounds)
    assert any(calls), "no traced pass took the one-call stack"
    assert any(p is not None for p in planned), "no pass wrote its attention probabilities itself"
    monkeypatch.setattr(fused, "stack", lambda *a: None)
    calls.clear()
    by_layer = _events(checkpoint(arch), draft, levels, bounds)
    assert not calls
    kinds = {e["type"] for e in one_call}
    assert {"attention", "embed", "logit_lens"} <= kinds and ("moe" in kinds) == (arch == "mixtral")
    assert len(one_call) == len(by_layer)
    for a, b in zip(one_call, by_layer):
        assert a == b, a["type"]
