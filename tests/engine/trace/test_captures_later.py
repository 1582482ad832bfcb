"""Issue 40: a `full` trace's per-token events (sample, embed, attention, moe) built after the
step (engine/trace/capture_queue.py): the step keeps their tensors, the request's newest step
is built live at the lens's rate, the rest after its last token. Whatever the path, the finished
trace holds the same events (content and step; their times differ) as a trace whose every event
was built at its step (lens_live_seconds 0, the way before), all before its `finish`."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from engine import CaptureConfig, EventList, SamplingParams, Tracer
from engine.llm_engine import DEFAULT_MODEL, LLMEngine
from tests.engine_utils import DEVICE

PROMPTS = [[5, 17, 40, 9, 33, 12, 7, 21], [3, 8, 13, 21, 34]]
N = 9
LATER = ("sample", "embed", "attention", "moe", "logit_lens")


def params(seed: int, greedy: bool = False) -> SamplingParams:  # knobs on: explain reads the draw's stages too
    if greedy:
        return SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    return SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=seed, max_tokens=N, ignore_eos=True)


def trace(path, live: float | None, batch: int, bound: int | None = None, greedy: bool = False,
          prompts: list = PROMPTS, seed: int = 0, **engine_args) -> list:
    sink = EventList()
    engine = LLMEngine(path, device=DEVICE, tracer=Tracer(sink), trace_level="full",
                       capture=CaptureConfig(logit_lens_top=3, lens_live_seconds=live), **engine_args)
    if bound is not None:
        engine.step_trace.later.max_pending_bytes = bound
    rids = [engine.add_request(p, params(i, greedy)) for i, p in enumerate(prompts[:batch], seed)]
    while engine.has_unfinished_requests():
        engine.step()
    assert not engine.step_trace.later.pending and not engine.step_trace.lenses.ended  # nothing left waiting
    for rid in rids:  # each request's trace ends with its `finish`, after every event it waited for
        types = [e.type for e in sink.of(rid)]
        assert types.count("finish") == 1 and types[-1] == "finish"
    return sink.events


def content(events: list, types=LATER) -> Counter:
    """The events of these types as their content and step (not their time), as a multiset;
    request ids by their arrival (each engine numbers its own)."""
    ids = [e.request_id for e in events if e.type == "request.arrive"]
    out = Counter()
    for e in (e for e in events if e.type in types):
        text = json.dumps([e.type, e.request_id, e.step, e.data], sort_keys=True)
        for i, rid in enumerate(ids):
            text = text.replace(f'"{rid}"', f'"request {i}"')
        out[text] += 1
    return out


@pytest.mark.parametrize("arch,batch", [("embedded", 1), ("llama", 1), ("llama", 2), ("embedded", 2)])
def test_every_path_gives_the_same_finished_trace(checkpoint, arch, batch):
    path = DEFAULT_MODEL if arch == "embedded" else checkpoint(arch)
    at_step = trace(path, 0.0, batch)  # every event built at its step
    later = [e for e in at_step if e.type in LATER]
    assert {e.type for e in later} >= {"sample", "embed", "attention", "logit_lens"}
    assert len([e for e in later if e.type == "sample"]) == batch * N
    after = trace(path, None, batch)  # all of them after the last token
    newest = trace(path, 1e9, batch)  # the first step live, the rest after the last token
    bounded = trace(path, None, batch, bound=1)  # the oldest built while it runs (the byte bound)
    want = content(at_step)  # (the others carry times: not compared)
    for got in (after, newest, bounded):
        assert content(got) == want
        assert Counter(e.type for e in got) == Counter(e.type for e in at_step)
    # the deferral did defer: after the first step, no step of `after` built its own token's sample
    first = [e for e in after if e.type in LATER]
    assert [e.type for e in after].index("finish") > [e.type for e in after].index(first[-1].type)
    token_steps = [e.step for e in after if e.type == "token"]
    samples_at = [i for i, e in enumerate(after) if e.type == "sample"]
    assert samples_at[1] > [i for i, e in enumerate(after) if e.type == "token"][-1]
    assert len(token_steps) == batch * N


@pytest.mark.parametrize("greedy", [True, False])
def test_speculative_rounds_keep_their_events(checkpoint, greedy):
    """Prompt lookup proposes several tokens a step (greedy, and seeded sampling): every kept
    token's sample, lens and pass captures, as built at its step."""
    path = checkpoint("llama")
    # (one-token lookups, and a seed whose draw accepts a proposal: a draft, a corrected and plain tokens)
    kw = {"draft": "ngram", "prompt_lookup_min": 1, "prompts": [[5, 17, 40, 9, 5, 17, 40, 9]], "seed": 5}
    at_step = trace(path, 0.0, 1, greedy=greedy, **kw)
    rounds = [e.data for e in at_step if e.type == "spec"]
    assert rounds and (greedy or any(r["accepted"] > 0 for r in rounds))
    for live in (None, 1e9):
        assert content(trace(path, live, 1, greedy=greedy, **kw), LATER + ("spec",)) == content(at_step, LATER + ("spec",))


def test_the_live_step_has_every_capture_of_the_newest_lens(checkpoint):
    """While a request runs, the pass whose lens is live has its sample, embed and attention too
    (the page shows the newest pass with a lens)."""
    sink = EventList()
    engine = LLMEngine(checkpoint("llama"), device=DEVICE, tracer=Tracer(sink), trace_level="full",
                       capture=CaptureConfig(logit_lens_top=3, lens_live_seconds=1e9))
    rid = engine.add_request(PROMPTS[0], params(0))
    engine.step()
    engine.step()
    engine.step_trace.lenses.live.last[rid] -= 2e9  # as if the live period went by
    engine.step()
    lens_steps = {e.step for e in sink.of(rid, "logit_lens")}
    assert lens_steps == {1, 3}
    for t in ("sample", "embed", "attention"):
        assert {e.step for e in sink.of(rid, t)} == lens_steps, t
    while engine.has_unfinished_requests():
        engine.step()
    assert len(sink.of(rid, "sample")) == N and sink.events[-1].type == "finish"
