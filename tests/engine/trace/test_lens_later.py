"""The logit lens computed after the pass (engine/trace/lens_queue.py): batched over a finished
request's tokens it is the same, bit for bit in its printed digits, as token by token; a
finished trace holds every token's lens before its `finish`, each stamped with the step
that drew its token; and each traced step says what its tracing cost (schedule.traced)."""
from __future__ import annotations

import pytest

from engine import CaptureConfig, EventList, SamplingParams, Tracer
from engine.llm_engine import DEFAULT_MODEL, LLMEngine
from tests.engine_utils import DEVICE

PROMPT = [5, 17, 40, 9, 33, 12, 7, 21]
N = 7


def run(path, live: float | None, n: int = N):
    sink = EventList()
    engine = LLMEngine(path, device=DEVICE, tracer=Tracer(sink), trace_level="full",
                       capture=CaptureConfig(logit_lens_top=4, lens_live_seconds=live))
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    return engine, rid, sink


@pytest.mark.parametrize("arch", ["llama", "embedded"])
def test_batched_at_the_finish_equals_token_by_token(checkpoint, arch):
    path = DEFAULT_MODEL if arch == "embedded" else checkpoint(arch)
    _, rid, each = run(path, live=0.0)  # every token's lens at its own step, alone
    engine, rid2, at_end = run(path, live=None)  # all of them at the finish, rows of many tokens a call
    a = [e.data for e in each.of(rid, "logit_lens")]
    b = [e.data for e in at_end.of(rid2, "logit_lens")]
    assert len(a) == len(b) == N and [e["position"] for e in b] == list(range(len(PROMPT), len(PROMPT) + N))
    assert a == b  # ids, ranks, probabilities, texts: the same numbers
    # token by token, each lens comes in its token's step; at the finish, after the last token, before `finish`
    steps = {e.data["position"]: e.step for e in at_end.of(rid2, "sample")}
    assert [e.step for e in at_end.of(rid2, "logit_lens")] == [steps[e["position"]] for e in b]
    types = [e.type for e in at_end.of(rid2)]
    last_sample = max(i for i, t in enumerate(types) if t == "sample")
    lens_at = [i for i, t in enumerate(types) if t == "logit_lens"]
    assert min(lens_at) > last_sample and max(lens_at) < types.index("finish")
    assert len(engine.step_trace.lenses.pending) == 0  # nothing left waiting


def test_every_traced_step_says_what_its_tracing_cost(checkpoint):
    engine, rid, sink = run(checkpoint("llama"), live=None)
    steps = sink.of(None, "schedule.step")
    traced = sink.of(None, "schedule.traced")
    assert [e.step for e in traced] == [e.step for e in steps]  # one each, the same step
    assert all(e.data["trace_seconds"] >= e.data["lens_seconds"] >= 0 for e in traced)
    assert traced[-1].data["lens_seconds"] > 0 and all(e.data["lens_seconds"] == 0 for e in traced[:-1])
