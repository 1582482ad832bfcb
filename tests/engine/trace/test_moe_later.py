"""Issue 40: a `full` trace's MoE routing stays the pass's tensors at the step
(engine/trace/moe_lists.py); its lists and each layer's expert load are made when the pass's
first `moe` event is built, mostly after the request's last token. The events built then are
the routing the pass wrote (checked against copies taken at the step: no later pass wrote over
it), with the whole batch's load, and the same as events built at their step."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from engine import CaptureConfig, EventList, SamplingParams, Tracer
from engine.llm_engine import DEFAULT_MODEL, LLMEngine
from tests.deepseek_tiny import make_deepseek
from tests.engine.trace.test_captures_later import content, trace
from tests.engine_utils import DEVICE

PROMPTS = [[5, 17, 40, 9, 33, 12, 7, 21], [3, 8, 13, 21, 34]]
N = 5


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    return make_deepseek("v3_moe", tmp_path_factory.mktemp("v3"))  # groups, a balance bias, a dense layer


def routed(path, live: float | None):
    """Two requests traced `full` -> (the trace's events, per step the routing the pass wrote as
    copies taken at the step [(layer, experts, weights, detail)], each request's rows in it, and
    whether the step's lists were made by the end of its step)."""
    sink = EventList()
    engine = LLMEngine(path, device=DEVICE, tracer=Tracer(sink), trace_level="full",
                       capture=CaptureConfig(logit_lens_top=0, lens_live_seconds=live))
    kept, made = {}, {}
    captures = engine.step_trace.captures

    def keep(step, config):  # after the pass and collect(), before the step's captures are kept or built
        routing = step.capture.moe
        assert not routing.converted  # collect() made no lists
        copy = lambda t: t.detach().clone()
        layers = [(layer, copy(e), copy(w), {k: copy(v) for k, v in routing.detail.get(layer, {}).items()})
                  for layer, e, w in routing.tensors()]
        starts = step.batch.query_starts
        rows = {p.scheduled.seq.request_id: slice(starts[b], starts[b + 1]) for b, p in enumerate(step.parts)}
        kept[step.number] = (layers, rows)
        captures(step, config)
        made[step.number] = routing.converted

    engine.step_trace.captures = keep
    for i, p in enumerate(PROMPTS):
        engine.add_request(p, SamplingParams(temperature=0.8, seed=i, max_tokens=N, ignore_eos=True))
    while engine.has_unfinished_requests() or engine.step_trace.waiting():
        engine.step()
    return sink.events, kept, made


def rounded4(t: torch.Tensor) -> list:
    return torch.round(t.double(), decimals=4).tolist()


@pytest.mark.parametrize("arch", ["embedded", "deepseek"])
def test_moe_events_are_the_routing_the_pass_wrote(deepseek, arch):
    path = DEFAULT_MODEL if arch == "embedded" else deepseek
    events, kept, made = routed(path, None)
    assert not any(made.values())  # no step built a `moe` event: every list was made after the last token
    moe = [e for e in events if e.type == "moe"]
    assert moe and {e.step for e in moe} == set(kept)
    assert all(events.index(e) > max(i for i, x in enumerate(events) if x.type == "token" and
                                     x.request_id == e.request_id) for e in moe)  # built after the last token
    for e in moe:
        layers, rows = kept[e.step]
        _, experts, weights, detail = next(x for x in layers if x[0] == e.data["layer"])
        sl = rows[e.request_id]
        n = len(e.data["experts"])
        assert 1 <= n <= sl.stop - sl.start and len(e.data["weights"]) == n
        assert e.data["experts"] == experts[sl][:n].tolist()
        assert e.data["weights"] == rounded4(weights[sl][:n])
        counts = Counter(x for row in experts.tolist() for x in row)  # the whole batch's pass, both requests
        assert e.data["batch_load"] == [counts[x] for x in range(e.data["num_experts"])]
        assert sum(e.data["batch_load"]) == experts.numel()
        for k, v in detail.items():  # DeepSeek: scores, biased, without_bias, groups
            assert e.data[k] == (rounded4(v[sl][:n]) if v.is_floating_point() else v[sl][:n].tolist()), k
    if arch == "deepseek":
        assert {"scores", "biased", "without_bias", "groups"} <= set(moe[0].data)
    steps = {e.step for e in events if e.type == "schedule.step" and len(e.data["batch"]) == 2}
    assert steps & {e.step for e in moe}  # batch 2: passes the two requests shared


def test_a_live_step_makes_its_pass_lists_at_the_step():
    """The requests' first step is live (its events built at the step), and their last (it ends
    them): those passes' lists are made then, once for both sequences; the other steps' only after
    the last token."""
    _, _, made = routed(DEFAULT_MODEL, 1e9)
    first, last = min(made), max(made)
    assert made[first] and made[last] and not any(v for step, v in made.items() if step not in (first, last))


def test_deepseek_moe_events_later_equal_those_at_their_step(deepseek):
    want = content(trace(deepseek, 0.0, 2), ("moe",))
    assert sum(want.values()) > 0
    for live in (None, 1e9):
        assert content(trace(deepseek, live, 2), ("moe",)) == want
