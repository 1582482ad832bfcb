"""DeepSeek V2 / V3 (multi-head latent attention + DeepSeek MoE) against transformers' own
DeepseekV2ForCausalLM / DeepseekV3ForCausalLM (eager attention, float32), on tiny random
checkpoints: with and without q_lora_rank, dense-only and MoE (shared experts, sigmoid
scores + correction bias, group-limited routing, routed_scaling_factor, first_k_dense_replace),
YaRN, in every chunking, batched, from the prefix cache and after preemption; and the pool,
which keeps kv_lora_rank + qk_rope_head_dim numbers per token per layer, not K and V."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, CaptureConfig, EventList, SamplingParams, Tracer
from engine.config import EngineConfig, ModelConfig, UnsupportedModelError
from engine.forward import prompt_logits
from engine.llm_engine import LLMEngine
from tests.engine_utils import DEVICE
from tests.deepseek_tiny import BASE, VARIANTS, make_deepseek
from tests.tiny import load_reference
from visualizers.attention_rows import key_positions
from visualizers.compact import array, per_layer

GEN = torch.Generator().manual_seed(7)
PROMPTS = [torch.randint(4, 300, (n,), generator=GEN).tolist() for n in (21, 9, 30)]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)

@pytest.fixture(scope="module", params=list(VARIANTS))
def ckpt(request, tmp_path_factory):
    return request.param, make_deepseek(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    return make_deepseek("v3_moe", tmp_path_factory.mktemp("v3"))


def hf_logits(path, ids):
    with torch.no_grad():
        return load_reference(path)(torch.tensor([ids])).logits[0]


def hf_greedy(path, prompt, n):
    with torch.no_grad():
        return load_reference(path).generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                                             eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()


# --- parity -------------------------------------------------------------------------------
def test_logits_in_every_chunking_match_transformers(ckpt):
    """Chunks of 1 are the absorbed decode path (the query moved into latent space), the
    others rebuild K and V per head: both equal transformers' full K/V attention."""
    name, path = ckpt
    llm = LLM(path, device=DEVICE, dtype="float32", block_size=4)
    expected = hf_logits(path, PROMPTS[0])
    assert expected.abs().max() > 1.0  # not near-uniform logits
    for chunk in (None, 1, 5):
        torch.testing.assert_close(prompt_logits(llm.engine, PROMPTS[0], chunk), expected, atol=1e-4, rtol=1e-4)


def test_greedy_batches_with_chunked_prefill_match_transformers(ckpt):
    """Three prompts at once under a 7-token budget: prefill chunks share steps with decodes."""
    name, path = ckpt
    llm = LLM(path, device=DEVICE, dtype="float32", block_size=4, max_num_batched_tokens=7)
    outs = llm.generate(PROMPTS, GREEDY)
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == hf_greedy(path, prompt, GREEDY.max_tokens), name


def test_prefix_cache_hit_and_preemption_keep_the_tokens(v3):
    expected = [hf_greedy(v3, p, GREEDY.max_tokens) for p in PROMPTS]
    llm = LLM(v3, device=DEVICE, dtype="float32", block_size=4)
    llm.generate(PROMPTS[0], GREEDY)
    again = llm.generate(PROMPTS[0][:17] + [5, 6], GREEDY)[0]  # 4 cached blocks of the first prompt
    assert again.usage.cached_tokens == 16
    assert again.token_ids == hf_greedy(v3, PROMPTS[0][:17] + [5, 6], GREEDY.max_tokens)
    small = LLM(v3, device=DEVICE, dtype="float32", block_size=4, num_kv_blocks=12, max_num_seqs=3,
                max_num_batched_tokens=16)
    outs = small.generate(PROMPTS, GREEDY)
    assert sum(o.metrics["preemptions"] for o in outs) > 0
    assert [o.token_ids for o in outs] == expected


def test_correction_bias_and_group_limit_matter(v3):
    """Guards against a vacuous parity: routing without the bias, or without the group
    limit, changes the logits of this checkpoint."""
    llm = LLM(v3, device=DEVICE, dtype="float32", block_size=4)
    base = prompt_logits(llm.engine, PROMPTS[2])
    moe = llm.engine.runner.model.model.layers[1].mlp
    bias = moe.gate.e_score_correction_bias
    kept = bias.detach().clone()
    with torch.no_grad():
        bias.zero_()
    try:
        assert not torch.allclose(prompt_logits(llm.engine, PROMPTS[2]), base, atol=1e-3)
    finally:
        with torch.no_grad():
            bias.copy_(kept)
    spec = moe.spec
    try:
        moe.spec = type(spec)(**{**spec.__dict__, "topk_group": spec.n_group})
        assert not torch.allclose(prompt_logits(llm.engine, PROMPTS[2]), base, atol=1e-3)
    finally:
        moe.spec = spec


# --- the pool -------------------------------------------------------------------------------
def test_pool_stores_the_latent(v3):
    llm = LLM(v3, device=DEVICE, dtype="float32", block_size=4, num_kv_blocks=10)
    cfg, runner = llm.engine.model_config, llm.engine.runner
    assert cfg.kv_layout == (1, 1, 16 + 4) and cfg.kv_bytes_per_token == 3 * 20
    assert tuple(runner.kv_cache.shape) == (1, 3, 10, 4, 1, 20)
    assert runner.kv_cache_bytes == 10 * 4 * 3 * 20 * 4
    # the latent rows are the model's: kv_a_layernorm(c) then the RoPE'd shared key
    seq_ids = PROMPTS[1]
    llm.generate(seq_ids, SamplingParams(temperature=0, max_tokens=1))
    ref = load_reference(v3)
    with torch.no_grad():
        h = ref.model.embed_tokens(torch.tensor([seq_ids]))
        attn = ref.model.layers[0].self_attn
        kv = attn.kv_a_proj_with_mqa(ref.model.layers[0].input_layernorm(h))[0]
        c = attn.kv_a_layernorm(kv[:, :16])
    stored = runner.kv_cache[0, 0].flatten(0, 2)  # layer 0's slots: the first block's rows are tokens 0-3
    assert any(torch.allclose(stored[b * 4:(b + 1) * 4, :16], c[:4], atol=1e-5) for b in range(10))


def test_captured_attention_equals_transformers(v3):
    """The trace scores the absorbed queries against the latent pool: transformers' per-head
    probabilities from full K and V, for prefill and decode rows."""
    sink = EventList()
    engine = LLMEngine(v3, device=DEVICE, tracer=Tracer(sink), trace_level="off",
                       config=EngineConfig(block_size=4, max_num_batched_tokens=7),
                       capture=CaptureConfig(attention_layers=[0, 2], heads=[1, 3], max_keys=12))
    rid = engine.add_request(PROMPTS[0], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
                             trace_level="full")
    while engine.has_unfinished_requests():
        engine.step()
    tokens = PROMPTS[0] + engine.get_output(rid).token_ids[:-1]
    with torch.no_grad():
        expected = load_reference(v3)(torch.tensor([tokens]), output_attentions=True).attentions
    events = per_layer(e.data for e in sink.of(rid, "attention"))
    assert {e["layer"] for e in events} == {0, 2} and {e["kind"] for e in events} == {"prefill", "decode"}
    for e in events:
        assert e["num_kv_heads"] == 1
        probs = torch.from_numpy(array(e["probs"]).copy())
        rows, keys = probs.shape[1:]
        cols = key_positions(e["k_head"], e["k_start"], keys)  # the first keys (the sink), then the newest
        want = expected[e["layer"]][0, [1, 3], e["q_start"]:e["q_start"] + rows][..., cols]
        torch.testing.assert_close(probs, want, atol=2.1e-3, rtol=0)  # the compact form: within 0.002


# --- config.json ----------------------------------------------------------------------------
def test_v3_config_fields_and_yarn():
    cfg = ModelConfig.from_hf({
        "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 129280, "hidden_size": 7168,
        "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
        "routed_scaling_factor": 2.5, "norm_topk_prob": True, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "max_position_embeddings": 163840, "rope_theta": 10000, "rope_scaling": {
            "type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096}})
    assert cfg.family == "deepseek_v3" and cfg.kv_layout == (1, 1, 576)
    assert cfg.kv_bytes_per_token * 2 == 61 * 576 * 2  # 70 KB a token in 16-bit
    assert cfg.moe_layers == [False] * 3 + [True] * 58 and cfg.num_experts == 256
    assert cfg.rotary_dim == 64 and cfg.head_dim == 192 and cfg.num_kv_heads == 1
    m = 0.1 * torch.log(torch.tensor(40.0)).item() + 1
    assert abs(cfg.attention_scale - 192 ** -0.5 * m * m) < 1e-9
    moe = cfg.deepseek_moe
    assert (moe.n_group, moe.topk_group, moe.scoring, moe.correction_bias) == (8, 4, "sigmoid", True)


@pytest.mark.parametrize("bad", [{"n_group": 3}, {"topk_group": 5}, {"moe_layer_freq": 2},
                                 {"rope_scaling": {"type": "longrope", "factor": 2.0}}])
def test_unsupported_configs_are_refused(bad):
    base = {"architectures": ["DeepseekV3ForCausalLM"], **BASE, "n_routed_experts": 8, "n_group": 4,
            "topk_group": 2, "num_experts_per_tok": 2}
    with pytest.raises(UnsupportedModelError):
        ModelConfig.from_hf({**base, **bad})


def test_describe_says_the_pool_keeps_the_latent(v3):
    llm = LLM(v3, device=DEVICE, dtype="float32", block_size=4, num_kv_blocks=10)
    kv = llm.engine.describe().kv_pool
    assert (kv.stores, kv.values_per_token_layer, kv.bytes_per_token) == ("latent", 20, 3 * 20 * 4)
    assert kv.bytes == llm.engine.runner.kv_cache_bytes == 10 * 4 * kv.bytes_per_token
    # full K and V: 3 layers x 4 heads x (12 + 12) dims x 4 bytes = 1152 a token, 4.8x the latent's 240
    assert kv.full_kv_bytes_per_token == 3 * 4 * 24 * 4
    assert kv.summary() == "latent: 20 numbers a token a layer (1/5 of full K and V)"
    shape = llm.engine.describe().model
    assert shape.mla["kv_lora_rank"] == 16 and shape.mla["qk_rope_head_dim"] == 4
    assert (shape.deepseek_moe["n_group"], shape.deepseek_moe["topk_group"]) == (4, 2)
    assert shape.moe_layers == [1, 2] and shape.num_kv_heads == 1


def test_bfloat16_keeps_the_router_in_float32_and_ngram_speculation_keeps_the_tokens(v3):
    bf16 = LLM(v3, device=DEVICE, dtype="bfloat16", block_size=4)
    gate = bf16.engine.runner.model.model.layers[1].mlp.gate
    assert gate.weight.dtype == gate.e_score_correction_bias.dtype == torch.float32
    kv_b = bf16.engine.runner.model.model.layers[1].self_attn.kv_b_proj  # CPU: its blocked copy is the weight
    assert (kv_b.blocked.dtype if kv_b.blocked is not None else kv_b.weight.dtype) == torch.bfloat16
    assert len(bf16.generate(PROMPTS[1], GREEDY)[0].token_ids) == GREEDY.max_tokens
    # the model as its own draft: verify passes of 4 rows a sequence take the rebuild path
    spec = LLM(v3, device=DEVICE, dtype="float32", block_size=4, draft=str(v3), num_speculative_tokens=3)
    outs = spec.generate(PROMPTS[:2], GREEDY)
    assert [o.token_ids for o in outs] == [hf_greedy(v3, p, GREEDY.max_tokens) for p in PROMPTS[:2]]
    load = spec.engine.load()
    assert load.spec_proposed > 0 and load.spec_accepted == load.spec_proposed


def test_start_up_line_says_the_pool_keeps_the_latent(v3):
    from app.__main__ import build_service, memory_line, parse_args
    service = build_service(parse_args(["--device", "cpu", "--model", str(v3), "--draft", "none"]))
    assert "tokens) of latent: 20 numbers a token a layer (1/5 of full K and V)" in memory_line(service)
