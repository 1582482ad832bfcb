"""Captures that last (issue 25, item 1): SmolLM2 at capture level full costs few enough bytes
a token that a 500-token answer keeps attention (every layer and head, the newest row each
step), the embedding rows and the logit lens within the default per-request cap. Before the
compact form a decode step cost ~177 kB and a 160-token answer froze at token 37.

Measured here on steps whose attention rows already hold every captured key (the first 8 and
the newest 52 once the context passes 64: the most a row costs), fed through the app's trace store, and projected to 500 tokens;
`python -m benchmarks.trace_bytes --tokens 500` runs the whole answer (7.8 MB of 8 MiB)."""
import json

import pytest

from app.serving.trace_store import MAX_BYTES_PER_REQUEST, TraceStore
from engine import EventList, SamplingParams, Tracer
from engine.llm_engine import LLMEngine
from tests.real_models import cached_gguf
from visualizers.compact import array

SEP = (",", ":")
ANSWER = 500


@pytest.mark.slow  # a real model, ~40 traced tokens
def test_a_500_token_smollm2_answer_keeps_its_captures_under_the_default_cap():
    sink = EventList()
    store = TraceStore()
    engine = LLMEngine(cached_gguf("smollm2"), device="cpu", tracer=Tracer(sink), trace_level="full")
    engine.tracer.add_sink(lambda e: e.request_id is None or store.add(e.request_id, e.to_dict()))
    prompt = [{"role": "user", "content": "Tell me a long story about a fox who lives in a forest and meets a bear."}]
    rid = engine.add_request(messages=prompt, params=SamplingParams(temperature=0.8, seed=1, max_tokens=40,
                                                                     ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    events = [e.to_dict() for e in sink.events if e.request_id in (rid, None)]  # the step's events too
    assert store.trace(rid).truncated is None
    by_step: dict[int, int] = {}
    for e in events:
        by_step[e["step"]] = by_step.get(e["step"], 0) + len(json.dumps(e, separators=SEP))
    full_keys = sorted({e["step"] for e in events if e["type"] == "attention" and e.get("k_head")
                        and array(e["probs"]).shape[-1] == 60})
    assert len(full_keys) >= 10
    per_token = sum(by_step[s] for s in full_keys) / len(full_keys)
    first = min(e["step"] for e in events if e["type"] == "token")
    prefill = sum(n for step, n in by_step.items() if step <= first)  # the request and the prompt's captures, once
    # every kind of capture is in those steps: attention of all 30 layers x 9 heads, the rows, the lens
    kinds = {e["type"] for e in events if e["step"] == full_keys[-1]}
    assert {"attention", "embed", "logit_lens", "sample"} <= kinds
    print(f"prefill {prefill:,} bytes, then {per_token:,.0f} a token")
    assert prefill + (ANSWER - 1) * per_token <= MAX_BYTES_PER_REQUEST * 0.97, (prefill, per_token)
