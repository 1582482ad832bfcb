"""A `full` trace's per-token events come in the order they were computed, not by position: a
live step's (the first, one every 0.2 s, the last) before the steps between them, built after
the answer (engine/trace/capture_queue.py). Where a panel or a value shows "the newest" with no
pass selected, it is the newest by position, whatever came last. A real engine's trace."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams, TraceEvent
from engine.llm_engine import DEFAULT_MODEL
from visualizers.code_values import beside
from visualizers.logit_lens import select
from visualizers.sampling import drawn_by

N = 8


@pytest.fixture(scope="module")
def traced():
    llm = LLM(DEFAULT_MODEL, device="cpu")
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=N, ignore_eos=True)
    evs = [i.to_dict() for i in llm.stream("Tell me about foxes.", params=params, trace="full")
           if isinstance(i, TraceEvent)]
    rid = next(e["request_id"] for e in evs if e["type"] == "tokenize")
    return rid, evs


def test_the_newest_is_the_last_position_not_the_last_event(traced):
    rid, events = traced
    samples = [e for e in events if e["type"] == "sample"]
    lenses = [e for e in events if e["type"] == "logit_lens"]
    positions = [e["position"] for e in samples]
    assert len(samples) == N and positions != sorted(positions)  # the last step's came before those between
    newest = max(samples, key=lambda e: e["position"])
    assert samples[drawn_by(samples, None)[0]] is newest
    assert select(lenses)["position"] == newest["position"] == select(lenses, 10**6)["position"]
    assert f"token {newest['token_id']} " in beside(events, rid)["sampling.drawn"]
