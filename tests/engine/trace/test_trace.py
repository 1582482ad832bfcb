"""Trace events: schema, every stage present, real numbers, bounds, and silence when off."""
import json

import pytest
import torch

from engine import LLM, CaptureConfig, EventList, SamplingParams, TokenOutput, TraceEvent, Tracer
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.trace import STAGES
from tests.engine_utils import DEVICE
from tests.tiny import load_reference
from visualizers.attention_rows import key_positions
from visualizers.compact import per_layer

PARAMS = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=5, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def run(checkpoint):
    llm = LLM(checkpoint("mixtral"), device=DEVICE, block_size=4,
              capture=CaptureConfig(attention_layers=[0, 2], heads=[1, 2, 3], max_keys=8, embed_dims=16,
                                    compact=False))
    items = list(llm.stream(messages=[{"role": "user", "content": "The quick brown fox"}], params=PARAMS))
    return llm, items


def events(items, prefix=""):
    return [i for i in items if isinstance(i, TraceEvent) and i.type.startswith(prefix)]


def test_every_stage_is_reported(run):
    _, items = run
    types = {e.type.split(".")[0] for e in events(items)}
    assert types == set(STAGES) - {"spec", "trace"}  # (trace.truncated: only when a reader caps the trace)


def test_schema_fields_and_json(run):
    _, items = run
    evs = events(items)
    rid = evs[0].request_id
    last_ts = 0.0
    for e in evs:
        d = json.loads(json.dumps(e.to_dict()))
        assert d["schema"] == 1 and d["type"] == e.type and d["step"] >= 0
        assert d["request_id"] in (rid, None)
        assert d["ts"] >= last_ts
        last_ts = d["ts"]
        assert TraceEvent.from_dict(d).to_dict() == d


def test_stream_interleaves_tokens_with_events(run):
    _, items = run
    tokens = [i for i in items if isinstance(i, TokenOutput)]
    assert len(tokens) == 6 and tokens[-1].finished
    first_token = items.index(tokens[0])
    assert any(isinstance(i, TraceEvent) and i.type == "sample" for i in items[:first_token])
    assert items[-1].text == "".join(t.text for t in tokens)


def test_tokenize_and_embed_carry_real_values(run):
    llm, items = run
    tok = events(items, "tokenize")[0].data
    ids = [t["id"] for t in tok["tokens"]]
    assert tok["count"] == len(ids) and tok["vocab_size"] == 320
    assert ids == llm.tokenizer.encode_chat([{"role": "user", "content": "The quick brown fox"}])
    assert tok["tokens"][0]["special"] and tok["tokens"][0]["piece"] == "<s>"
    embed = events(items, "embed")[0].data
    weight = llm.engine.runner.model.model.embed_tokens.weight
    assert embed["shape"] == [len(ids), 64] and embed["dims"] == 16
    torch.testing.assert_close(torch.tensor(embed["rows"]), weight[ids, :16].cpu(), atol=1e-4, rtol=0)


def test_attention_is_bounded_and_normalised(run):
    _, items = run
    att = events(items, "attention")
    assert all(e.data["layers"] == [0, 2] for e in att)  # one event a pass, both captured layers in it
    for e in att:
        probs = torch.tensor(e.data["probs"])
        assert probs.shape[:2] == (2, 3) and probs.shape[2] <= 8 and probs.shape[3] <= 8
        assert e.data["heads"] == [1, 2, 3] and e.data["kv_heads"] == [0, 1, 1]
    decode = [e.data for e in att if e.data["kind"] == "decode"]
    assert decode and all(len(d["probs"][0][0]) == 1 for d in decode)


def test_attention_equals_transformers_attention(run, checkpoint):
    """The captured prefill corner is exactly what HF's eager attention computes."""
    _, items = run
    ids = [t["id"] for t in events(items, "tokenize")[0].data["tokens"]]
    ref = load_reference(checkpoint("mixtral"))
    with torch.no_grad():
        attentions = ref(torch.tensor([ids]), output_attentions=True).attentions
    for d in per_layer(e.data for e in events(items, "attention")):
        if d["kind"] != "prefill":
            continue
        probs = torch.tensor(d["probs"])
        cols = key_positions(d["k_head"], d["k_start"], probs.shape[-1])  # the first keys (the sink), then the newest
        expected = attentions[d["layer"]][0, d["heads"], d["q_start"]:][..., cols]
        torch.testing.assert_close(probs, expected, atol=2e-4, rtol=0)
        assert d["q_start"] == len(ids) - 8 and list(cols) == [0, 1, 2, 3, len(ids) - 2, len(ids) - 1]


def test_moe_routing_matches_router(run):
    _, items = run
    moe = events(items, "moe")
    assert {e.data["layer"] for e in moe} == {0, 1, 2}
    for e in moe:
        w = torch.tensor(e.data["weights"])
        assert w.shape[1] == 2 and torch.allclose(w.sum(-1), torch.ones(len(w)), atol=1e-3)
        assert sum(e.data["batch_load"]) == 2 * sum(
            b["num_tokens"] for b in [s for s in events(items, "schedule.step") if s.step == e.step][0].data["batch"])


def test_kv_and_finish(run):
    _, items = run
    alloc = [b for e in events(items, "kv.alloc") for b in e.data["blocks"]]
    fills = [f for e in events(items, "kv.fill") for f in e.data["fills"]]
    assert sum(f["count"] for f in fills) == events(items, "finish")[0].data["usage"]["prompt_tokens"] + 5
    assert {f["block"] for f in fills} == set(alloc)
    freed = events(items, "kv.free")[0].data
    assert sorted(freed["blocks"]) == sorted(alloc)
    fin = events(items, "finish")[0].data
    assert fin["reason"] == "length" and fin["usage"]["completion_tokens"] == 6
    split = fin["ttft_split"]
    assert abs(sum(split.values()) - fin["ttft"]) < 1e-6 and len(fin["token_latencies"]) == 5
    sample = events(items, "sample")[0].data
    assert sample["stages"]["top_k"]["kept"] == 20 and sample["stages"]["top_p"]["kept"] <= 20
    assert len(sample["candidate_texts"]) == len(sample["candidates"]) and isinstance(sample["token_text"], str)


def test_ttft_parts_measure_where_the_time_went(checkpoint):
    """One request waits behind another (one running at a time); the other's prompt is
    prefilled in chunks. Each part of the TTFT split shows it, checked against the engine's
    own record of its steps (each schedule.step's start and phases), never a wall-clock sum
    against another: so it holds however busy the machine is."""
    sink = EventList()
    engine = LLMEngine(checkpoint("mixtral"), device=DEVICE, tracer=Tracer(sink),
                       config=EngineConfig(block_size=4, max_num_seqs=1, max_num_batched_tokens=8))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    first = engine.add_request(list(range(10, 50)), params)  # 40 tokens: 5 chunks of 8
    second = engine.add_request([5, 6, 7], params)
    while engine.has_unfinished_requests():
        engine.step()
    m1, m2 = engine.get_output(first).metrics, engine.get_output(second).metrics
    for m in (m1, m2):
        assert all(v >= 0 for v in m["ttft_split"].values()) and len(m["token_latencies"]) == 7
        assert sum(m["ttft_split"].values()) == pytest.approx(m["ttft"], abs=1e-9)  # the parts are the whole
    steps = {e.step: e.data for e in sink.of(None, "schedule.step")}
    ran = lambda rid: sorted(n for n, d in steps.items() if any(b["request_id"] == rid for b in d["batch"]))
    kinds = lambda rid: [b["kind"] for n in ran(rid) for b in steps[n]["batch"] if b["request_id"] == rid]
    one, two = ran(first), ran(second)
    # the first ran from the first step, its prompt in 5 chunks; the second only after the first's last step
    assert kinds(first) == ["prefill"] * 5 + ["decode"] * 7 and kinds(second) == ["prefill"] + ["decode"] * 7
    assert one[0] == min(steps) and two[0] > one[-1]
    begin = lambda n: steps[n]["start"]  # a step's phases: schedule, forward, sample
    forward = lambda n: begin(n) + steps[n]["schedule_seconds"]
    forward_end = lambda n: forward(n) + steps[n]["forward_seconds"]

    def timeline(m, prefilled_at: int) -> tuple[float, float, float]:
        """(tokenized, scheduled, prefilled) on the steps' clock: the request's first token was
        drawn at the end of the sample phase of the step that finished its prompt."""
        split = m["ttft_split"]
        arrived = forward_end(prefilled_at) + steps[prefilled_at]["sample_seconds"] - m["ttft"]
        tokenized = arrived + split["tokenize"]
        return tokenized, tokenized + split["queue"], tokenized + split["queue"] + split["prefill"]

    eps = 1e-6  # float rounding only
    tokenized1, scheduled1, prefilled1 = timeline(m1, one[4])
    tokenized2, scheduled2, prefilled2 = timeline(m2, two[0])
    # queue: the first is admitted in its first step, before that step's forward pass; the
    # second, tokenized before any step ran, only in the step after the first's last one
    assert begin(one[0]) - eps <= scheduled1 <= forward(one[0]) + eps
    assert tokenized2 <= begin(one[0]) + eps and begin(two[0]) - eps <= scheduled2 <= forward(two[0]) + eps
    assert m2["ttft_split"]["queue"] >= begin(two[0]) - begin(one[0]) - eps >= sum(
        steps[n]["forward_seconds"] for n in one)
    # prefill: the first's spans its 5 chunk steps, the second's one chunk's step
    assert prefilled1 == pytest.approx(forward_end(one[4]), abs=eps)
    assert m1["ttft_split"]["prefill"] >= sum(steps[n]["forward_seconds"] for n in one[:5]) - eps
    assert prefilled2 == pytest.approx(forward_end(two[0]), abs=eps)
    assert m2["ttft_split"]["prefill"] <= forward_end(two[0]) - begin(two[0]) + eps


def test_tracing_off_emits_nothing(checkpoint):
    sink = EventList()
    engine = LLMEngine(checkpoint("mixtral"), device=DEVICE, tracer=Tracer(sink), trace_level="off",
                       config=EngineConfig(block_size=4, num_kv_blocks=12))
    rid = engine.add_request([5, 6, 7, 8, 9], SamplingParams(temperature=0, max_tokens=5))
    while engine.has_unfinished_requests():
        engine.step()
    # a long prompt evicts the first one's cached blocks: still nothing is reported
    engine.add_request(list(range(20, 60)), SamplingParams(temperature=0, max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()
    assert sink.events == []
    assert engine.get_output(rid).usage.completion_tokens == 5


def test_only_traced_requests_are_reported(checkpoint):
    sink = EventList()
    engine = LLMEngine(checkpoint("mixtral"), device=DEVICE, tracer=Tracer(sink), trace_level="off",
                       config=EngineConfig(block_size=4))
    quiet = engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=3))
    loud = engine.add_request([9, 10, 11], SamplingParams(temperature=0, max_tokens=3), trace_level="basic")
    while engine.has_unfinished_requests():
        engine.step()
    assert {e.request_id for e in sink.events} == {loud, None}
    assert not sink.of(loud, "attention")  # basic: no tensors
    step = sink.of(None, "schedule.step")[0].data
    assert {b["request_id"] for b in step["batch"]} == {quiet, loud}  # the batch is shown whole


def test_an_unknown_stage_is_refused_every_time():
    """emit_plain checks a type's stage once (a known type is not split again): an unknown
    stage is never let through, however often it comes."""
    sink = EventList()
    tracer = Tracer(sink)
    for _ in range(2):
        with pytest.raises(ValueError, match="unknown trace stage"):
            tracer.emit_plain("nostage.step", None, 0, {})
        tracer.emit_plain("schedule.step", None, 0, {})
    assert [e.type for e in sink.events] == ["schedule.step"] * 2
