"""The engine's own clock of its tracing work, by kind (engine/trace/costs.py): each kind a
traced request does is timed, and an untraced one adds nothing."""
from __future__ import annotations

import time

from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.trace import EventList, Tracer

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _run(engine: LLMEngine, level: str) -> None:
    rid = engine.add_request([5, 9, 14, 3, 7], GREEDY, trace_level=level)
    while engine.has_unfinished_requests():
        engine.step()
    engine.release(rid)


def test_each_kind_of_a_full_trace_is_timed_and_untraced_work_adds_none(checkpoint):
    sink = EventList()
    engine = LLMEngine(checkpoint("mixtral"), device="cpu", tracer=Tracer(sink))
    engine.step_trace.costs.take()
    _run(engine, "off")  # (None: the engine's default level)
    assert not any(engine.step_trace.costs.take().values()) and engine.lane.pool_trace.seconds == 0.0
    _run(engine, "full")
    spent = engine.step_trace.costs.take()
    assert all(spent[k] > 0 for k in ("schedule", "kv fills", "sampling", "logit lens", "embedding rows",
                                      "attention", "moe routing")), spent
    assert spent["speculation"] == 0.0 and engine.lane.pool_trace.seconds > 0


def test_the_captures_collected_after_the_forward_are_trace_time_not_the_passes(checkpoint, monkeypatch,
                                                                              cpu_kernels_switch):
    """collect() runs inside the runner's pass: its time goes to the step's schedule.traced,
    and schedule.step's forward_seconds (the timeline's bar) is the engine's own. The
    attention capture is made to take 0.5 s, far beyond a tiny model's pass (PyTorch's path:
    the C kernels' one-call pass writes the probabilities itself, engine/trace/pass_probs.py)."""
    from engine.trace import capture as capture_module
    cpu_kernels_switch(False)
    real = capture_module._attention

    def slow(*args, **kwargs):
        time.sleep(0.5)
        return real(*args, **kwargs)
    monkeypatch.setattr(capture_module, "_attention", slow)
    sink = EventList()
    engine = LLMEngine(checkpoint("llama"), device="cpu", tracer=Tracer(sink))
    rid = engine.add_request([5, 9, 14, 3, 7], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
                             trace_level="full")
    while engine.has_unfinished_requests():
        engine.step()
    engine.release(rid)
    steps = {e.step: e.data for e in sink.of(None, "schedule.step")}
    traced = {e.step: e.data for e in sink.of(None, "schedule.traced")}
    assert steps and set(steps) == set(traced)
    for n, step in steps.items():
        assert step["forward_seconds"] < 0.5 <= traced[n]["trace_seconds"], (step, traced[n])
    # the request's own times: each held a 0.5 s capture; less what watching added, each is the engine's
    fin = sink.of(rid, "finish")[0].data
    watched = fin["trace_seconds"]
    assert len(watched["token_latencies"]) == len(fin["token_latencies"]) == 1
    assert fin["ttft"] - watched["ttft"] < 0.5 <= watched["ttft"]
    for own, added in zip(fin["token_latencies"], watched["token_latencies"]):
        assert own - added < 0.5 <= added


def test_an_untraced_request_has_no_trace_seconds(checkpoint):
    engine = LLMEngine(checkpoint("llama"), device="cpu", tracer=Tracer(EventList()))
    rid = engine.add_request([5, 9, 14], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
                             trace_level="off")
    while engine.has_unfinished_requests():
        engine.step()
    assert "trace_seconds" not in engine.get_output(rid).metrics and "ttft" in engine.get_output(rid).metrics
