"""What a server reads of the engine, through its public methods only: describe() (the
model, pool, drafts, layout), load() (the requests and blocks now), add_request's one
context check, and stop_captures() (a reader's byte cap)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from engine import ContextLengthError, EngineInfo, EventList, SamplingParams, Tracer
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.kernels.cpu import blocked_bytes
from tests.engine_utils import DEVICE


@pytest.fixture(scope="module")
def engine(checkpoint):
    return LLMEngine(checkpoint("mixtral"), device=DEVICE, tracer=Tracer(EventList()), draft=checkpoint("mistral"),
                     num_speculative_tokens=3, config=EngineConfig(block_size=4, num_kv_blocks=40, max_model_len=64))


def test_describe_tells_the_model_pool_drafts_and_layout(engine):
    info = engine.describe()
    assert isinstance(info, EngineInfo) and engine.describe() is info  # built once
    cfg, m, kv = engine.model_config, info.model, info.kv_pool
    assert (m.architecture, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim, m.vocab_size) == (
        cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size)
    assert m.num_experts == cfg.num_experts and m.experts_per_token == cfg.num_experts_per_tok
    assert m.moe_layers == [i for i, x in enumerate(cfg.moe_layers) if x] and m.max_model_len == 64
    assert m.dtype == "float32" and m.device == DEVICE
    assert m.weights_bytes == sum(p.numel() * p.element_size() for p in engine.runner.model.parameters()) + \
        sum(b.numel() * b.element_size() for b in engine.runner.model.buffers()) + blocked_bytes(engine.runner.model)  # the C kernels' blocked weights: their only copy
    assert (kv.num_blocks, kv.block_size, kv.tokens) == (40, 4, 160)
    assert kv.bytes == engine.runner.kv_cache_bytes == kv.tokens * kv.bytes_per_token
    assert kv.bytes_per_token == 2 * m.num_layers * m.num_kv_heads * m.head_dim * kv.bytes_per_value
    assert kv.dtype == str(engine.runner.kv_cache.dtype).replace("torch.", "") == "float32"
    spec = info.speculation
    assert spec.method == "draft" and spec.num_speculative_tokens == 3
    assert spec.draft.architecture == "MistralForCausalLM" and spec.draft_kv_bytes > 0
    assert info.parallel.tensor_parallel_size == 1 and info.parallel.placement is None
    assert info.parallel.split_sizes == [2]  # the tiny MoE's 2 KV heads
    assert info.quantization is None and info.cuda_graphs is None
    d = info.as_dict()
    assert json.loads(json.dumps(d)) == d and d["kv_pool"]["num_blocks"] == 40


def test_ngram_speculation_is_described_without_a_draft_model(checkpoint):
    e = LLMEngine(checkpoint("llama"), device=DEVICE, draft="ngram", config=EngineConfig(num_kv_blocks=8))
    spec = e.describe().speculation
    assert spec.method == "ngram" and spec.draft is None and spec.draft_kv_bytes == 0
    assert LLMEngine(checkpoint("llama"), device=DEVICE, config=EngineConfig(num_kv_blocks=8)).describe().speculation is None


def test_load_counts_requests_and_blocks(engine):
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    a = engine.add_request(list(range(10, 30)), params, trace_level="off")
    b = engine.add_request(list(range(10, 30)), params, trace_level="off")
    assert engine.live_requests() == [a, b]
    load = engine.load()
    assert (load.running, load.waiting, load.blocks_used, load.blocks_free) == (0, 2, 0, 40)
    engine.step()
    load = engine.load()
    assert load.running == 2 and load.waiting == 0 and load.blocks_used > 0
    assert load.blocks_used + load.blocks_cached + load.blocks_free == 40 and load.steps == engine.step_count
    while engine.has_unfinished_requests():
        engine.step()
    load = engine.load()
    assert engine.live_requests() == [] and load.running == load.blocks_used == 0 and load.blocks_cached > 0
    assert load.generated_tokens == 8 and load.prefix_queried_tokens == 40 and load.target_passes == load.steps
    engine.release(a), engine.release(b)


def test_one_context_check_refuses_lowers_or_runs(engine):
    prompt = list(range(10, 50))  # 40 tokens of a 64-token context: room for 24
    with pytest.raises(ContextLengthError) as err:
        engine.add_request(prompt, SamplingParams(max_tokens=25), context_fit="refuse")
    assert str(err.value) == ("max_tokens is too large: 25. This model's maximum context length is 64 tokens and the "
                              "prompt has 40 tokens (25 > 64 - 40): ask for at most 24")
    assert (err.value.prompt_tokens, err.value.max_tokens, err.value.max_model_len) == (40, 25, 64)
    assert engine.live_requests() == []  # refused: nothing queued
    fits = engine.add_request(prompt, SamplingParams(max_tokens=24), context_fit="refuse")
    lowered = engine.add_request(prompt, SamplingParams(max_tokens=100), context_fit="lower")
    runs = engine.add_request(prompt, SamplingParams(max_tokens=100))  # "run": until the context is full
    assert engine.requests[lowered].params.max_tokens == 24 and engine.requests[runs].params.max_tokens == 100
    with pytest.raises(ValueError, match="the prompt has 64 tokens but this model's context is 64"):
        engine.add_request(list(range(64)), SamplingParams(max_tokens=1), context_fit="refuse")
    with pytest.raises(ValueError, match="context_fit"):
        engine.add_request(prompt, context_fit="squeeze")
    for rid in (fits, lowered, runs):
        engine.abort(rid)
    while engine.has_unfinished_requests():
        engine.step()


def test_stop_captures_says_so_and_the_captures_stop_from_the_next_step(checkpoint):
    sink = EventList()
    engine = LLMEngine(checkpoint("mixtral"), device=DEVICE, tracer=Tracer(sink), config=EngineConfig(block_size=4))
    engine.capture = replace(engine.capture, lens_live_seconds=0.0)  # every step's captures at its step
    rid = engine.add_request(list(range(10, 20)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                             trace_level="full")
    engine.step()
    engine.step()
    assert sink.of(rid, "attention")
    cut_at = engine.step_count
    assert engine.stop_captures(rid, 1234)
    note = sink.of(rid, "trace.truncated")
    assert len(note) == 1 and note[0].step == cut_at and note[0].data["limit_bytes"] == 1234
    # where the captures stop: the first pass without them, its first position, the token it predicts
    assert note[0].data["first_step"] == cut_at + 1
    assert note[0].data["position"] == 10 + 2 - 1 and note[0].data["token_index"] == 2
    while engine.has_unfinished_requests():
        engine.step()
    heavy = [e for e in sink.events if e.request_id == rid and e.type in ("attention", "embed", "moe", "logit_lens")]
    assert max(e.step for e in heavy) == cut_at
    assert sum(e.type == "token" for e in sink.of(rid)) == 8  # the rest of the trace goes on
    assert not engine.stop_captures(rid, 1234)  # finished
    assert not engine.stop_captures("nobody", 1234)


def test_stop_captures_drops_the_waiting_captures_and_says_where_they_end(checkpoint):
    """Captures built after their step (none live here) that still wait when the reader's cap is
    met are dropped: the note names the oldest dropped pass, and every pass before it has its own."""
    sink = EventList()
    engine = LLMEngine(checkpoint("mixtral"), device=DEVICE, tracer=Tracer(sink), config=EngineConfig(block_size=4))
    live = replace(engine.capture, lens_live_seconds=0.0)
    engine.capture = live
    rid = engine.add_request(list(range(10, 20)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                             trace_level="full")
    engine.step()  # the prompt's pass: its captures at its step
    engine.capture = replace(live, lens_live_seconds=None)  # from here on every capture waits
    engine.step()
    engine.step()
    assert max(e.step for e in sink.of(rid, "attention")) == 1
    assert engine.stop_captures(rid, 1234)
    note = sink.of(rid, "trace.truncated")
    assert len(note) == 1 and note[0].data["first_step"] == 2
    assert note[0].data["position"] == 10 and note[0].data["token_index"] == 1
    while engine.has_unfinished_requests():
        engine.step()
    heavy = [e for e in sink.events if e.request_id == rid and e.type in ("attention", "embed", "moe", "logit_lens")]
    assert {e.step for e in heavy} == {1}
    assert sum(e.type == "sample" for e in sink.of(rid)) == 8 and sum(e.type == "token" for e in sink.of(rid)) == 8


def test_bfloat16_weights_on_the_cpu_describe_their_float32_pool_apart(checkpoint):
    """The KV formula on the page read the weights' dtype ("bfloat16") beside the pool's 4 bytes."""
    eng = LLMEngine(checkpoint("llama"), device="cpu", dtype="bfloat16",
                    config=EngineConfig(block_size=4, num_kv_blocks=8, max_model_len=32))
    kv = eng.describe().kv_pool
    assert eng.describe().model.dtype == "bfloat16"
    assert (kv.dtype, kv.bytes_per_value) == ("float32", 4)  # the pass and its pool stay float32 on the CPU
