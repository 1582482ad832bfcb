"""Gemma 3 text models against transformers' own Gemma3ForCausalLM (eager attention, float32):
local (sliding-window) layers with their own RoPE base between global ones, QK-norm, (1 + w)
RMSNorms before and after attention and MLP, scaled embeddings, query_pre_attn_scalar, GeGLU.
Logit parity in every chunking is in tests/engine/test_parity.py (the "gemma3" entry of tests/tiny.py);
here: config spellings, longer prompts in batches and chunks, the Triton decode path, captured
attention of local and global layers, and the page's words about them."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, CaptureConfig, EventList, SamplingParams, Tracer
from engine.config import EngineConfig, ModelConfig, UnsupportedModelError
from engine.forward import prompt_logits
from engine.llm_engine import LLMEngine
from tests.engine_utils import DEVICE
from tests.tiny import load_reference, make_checkpoint, save_tokenizer, scale_weights
from visualizers.attention_rows import key_positions
from visualizers.compact import array, per_layer

GEN = torch.Generator().manual_seed(5)
PROMPTS = [torch.randint(4, 300, (n,), generator=GEN).tolist() for n in (23, 9, 31)]
WINDOW = 6  # tests/tiny.py: layers alternate local (window 6) and global


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """Five layers: local, global, local, global, local."""
    return make_checkpoint("gemma3", tmp_path_factory.mktemp("gemma3"), seed=2, num_layers=5)


def hf_greedy(path, prompt, n):
    with torch.no_grad():
        return load_reference(path).generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                                             eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()


# --- config.json spellings -------------------------------------------------------------
def test_config_reads_layer_types_ropes_and_scales(gemma):
    llm = LLM(gemma, device=DEVICE, dtype="float32", block_size=4)
    cfg = llm.engine.model_config
    assert cfg.family == "gemma3" and cfg.sliding_windows == [WINDOW, None, WINDOW, None, WINDOW]
    assert (cfg.rope_theta, cfg.rope_scaling) == (5000.0, {"rope_type": "linear", "factor": 2.0})
    assert (cfg.local_rope_theta, cfg.local_rope_scaling) == (100.0, None)
    assert cfg.attention_scale == 20 ** -0.5 and cfg.head_dim == 24 and cfg.hidden_act == "gelu_pytorch_tanh"
    assert cfg.tie_word_embeddings and cfg.norm_offset and cfg.sandwich_norms and cfg.embed_scale == 8.0
    layers = llm.engine.runner.model.model.layers
    assert [layer.self_attn.rope for layer in layers] == ["local", "global", "local", "global", "local"]
    names = dict(llm.engine.runner.model.named_parameters())
    assert "model.layers.3.pre_feedforward_layernorm.weight" in names
    assert "model.layers.3.post_feedforward_layernorm.weight" in names


def test_older_config_spelling():
    """transformers 4.x files: rope_theta + rope_local_base_freq + rope_scaling (global layers
    only), and sliding_window_pattern instead of layer_types (every 6th layer global)."""
    cfg = ModelConfig.from_hf({
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 32, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "sliding_window": 512,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "query_pre_attn_scalar": 32})
    assert cfg.sliding_windows == [512] * 5 + [None] + [512] * 5 + [None]
    assert (cfg.rope_theta, cfg.rope_scaling) == (1e6, {"rope_type": "linear", "factor": 8.0})
    assert (cfg.local_rope_theta, cfg.local_rope_scaling) == (1e4, None)
    assert cfg.tie_word_embeddings and cfg.attention_scale == 32 ** -0.5


def test_multimodal_config_uses_its_text_config_and_gemma_defaults():
    cfg = ModelConfig.from_hf({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                               "eos_token_id": [1, 106], "text_config": {
                                   "hidden_size": 2560, "num_hidden_layers": 34, "sliding_window": 1024,
                                   "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}})
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (8, 4, 256, 262_208)
    assert cfg.sliding_windows[:6] == [1024] * 5 + [None] and cfg.eos_token_ids == [1, 106]
    assert cfg.rope_theta == 1e6 and cfg.rope_scaling["factor"] == 8.0 and cfg.local_rope_theta == 1e4


@pytest.mark.parametrize("bad", [{"attn_logit_softcapping": 50.0}, {"use_bidirectional_attention": True},
                                 {"hidden_activation": "relu"}])
def test_unsupported_features_are_refused(bad):
    with pytest.raises(UnsupportedModelError):
        ModelConfig.from_hf({"architectures": ["Gemma3ForCausalLM"], **bad})


# --- parity -------------------------------------------------------------------------------
def test_window_and_local_rope_matter(gemma):
    """Guards against a vacuous parity: ignoring a local layer's window, or giving it the
    global RoPE, changes the logits past the window."""
    llm = LLM(gemma, device=DEVICE, dtype="float32", block_size=4)
    attn = llm.engine.runner.model.model.layers[0].self_attn
    base = prompt_logits(llm.engine, PROMPTS[0], len(PROMPTS[0]))
    for field, changed in (("window", None), ("rope", "global")):
        kept = getattr(attn, field)
        setattr(attn, field, changed)
        try:
            other = prompt_logits(llm.engine, PROMPTS[0], len(PROMPTS[0]))
        finally:
            setattr(attn, field, kept)
        assert not torch.allclose(base[WINDOW:], other[WINDOW:], atol=1e-3), field
    assert torch.allclose(base[:WINDOW], prompt_logits(llm.engine, PROMPTS[0], 1)[:WINDOW], atol=1e-4)


@pytest.mark.parametrize("use_triton", [False, pytest.param(True, marks=pytest.mark.slow)],  # slow: Triton interpreted
                         ids=["torch", "triton"])
def test_greedy_batches_with_chunked_prefill_match_transformers(gemma, use_triton):
    """Three prompts longer than the window at once, under a 7-token budget: prefill chunks
    share steps with other requests' decodes. Triton: the decode kernel (interpreted on CPU)."""
    n = 16
    llm = LLM(gemma, device=DEVICE, dtype="float32", block_size=4, max_num_batched_tokens=7,
              use_triton=use_triton)
    assert llm.engine.runner.use_triton == use_triton
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == hf_greedy(gemma, prompt, n)


def test_final_logit_softcapping_and_a_plain_rope_config(tmp_path):
    """final_logit_softcapping (unset in Gemma 3's releases, but read) and the defaults of a
    config without rope_parameters entries per layer."""
    import transformers
    cfg = transformers.Gemma3TextConfig(
        vocab_size=320, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, sliding_window=4, max_position_embeddings=128,
        final_logit_softcapping=2.0, bos_token_id=0, eos_token_id=1, pad_token_id=None)
    model = transformers.Gemma3ForCausalLM(cfg)
    scale_weights(model, 4)
    model.save_pretrained(str(tmp_path))
    save_tokenizer(tmp_path)
    llm = LLM(tmp_path, device=DEVICE, dtype="float32", block_size=4)
    assert llm.engine.model_config.final_logit_softcapping == 2.0
    assert llm.engine.model_config.sliding_windows == [4, 4, 4]  # fewer layers than the pattern of 6
    with torch.no_grad():
        expected = load_reference(tmp_path)(torch.tensor([PROMPTS[1]])).logits[0]
    got = prompt_logits(llm.engine, PROMPTS[1], 3)
    assert expected.abs().max() < 2.0
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)


def test_multimodal_checkpoint_runs_its_language_model(tmp_path):
    """A Gemma3ForConditionalGeneration file: the language model's tensors load, the vision
    tower's are skipped; text-only logits equal transformers'."""
    import transformers
    text = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=24, query_pre_attn_scalar=20, sliding_window=6,
                sliding_window_pattern=2, max_position_embeddings=128, bos_token_id=0, eos_token_id=1,
                pad_token_id=None)
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                    image_token_index=300, boi_token_index=301, eoi_token_index=302)
    model = transformers.Gemma3ForConditionalGeneration(cfg)
    scale_weights(model, 6)
    model.save_pretrained(str(tmp_path))
    save_tokenizer(tmp_path)
    llm = LLM(tmp_path, device=DEVICE, dtype="float32", block_size=4)
    with torch.no_grad():
        expected = model.eval()(input_ids=torch.tensor([PROMPTS[0]])).logits[0]
    torch.testing.assert_close(prompt_logits(llm.engine, PROMPTS[0], 5), expected, atol=2e-4, rtol=1e-4)


# --- captured attention ---------------------------------------------------------------------
def test_captured_attention_of_local_and_global_layers_equals_transformers(gemma):
    sink = EventList()
    engine = LLMEngine(gemma, device=DEVICE, tracer=Tracer(sink), trace_level="off",
                       config=EngineConfig(block_size=4, max_num_batched_tokens=7),
                       capture=CaptureConfig(attention_layers=[0, 1], heads=[0, 3], max_keys=12))
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    rid = engine.add_request(PROMPTS[0], greedy, trace_level="full")
    while engine.has_unfinished_requests():
        engine.step()
    tokens = PROMPTS[0] + engine.get_output(rid).token_ids[:-1]
    with torch.no_grad():
        expected = load_reference(gemma)(torch.tensor([tokens]), output_attentions=True).attentions
    events = per_layer(e.data for e in sink.of(rid, "attention"))
    assert {e["layer"] for e in events} == {0, 1} and {e["kind"] for e in events} == {"prefill", "decode"}
    for e in events:
        assert e["window"] == (WINDOW if e["layer"] == 0 else None)
        probs = torch.from_numpy(array(e["probs"]).copy())
        rows, keys = probs.shape[1:]
        cols = key_positions(e["k_head"], e["k_start"], keys)  # the first keys (the sink), then the newest
        want = expected[e["layer"]][0, [0, 3], e["q_start"]:e["q_start"] + rows][..., cols]
        torch.testing.assert_close(probs, want, atol=2.1e-3, rtol=0)  # the compact form: within 0.002
        old = cols <= e["q_start"] + rows - 1 - WINDOW
        if e["layer"] == 0 and old.any():  # the local layer's last row: nothing older than the window
            assert float(probs[:, -1, old].abs().max()) == 0.0


# --- the page's words -----------------------------------------------------------------------
def test_attention_panel_and_classroom_say_which_layers_are_local():
    import visualizers as viz
    from visualizers.journey import journey
    windows = [512] * 5 + [None] + [512] * 5 + [None]
    ev = {"layer": 5, "kind": "prefill", "heads": [0], "q_start": 0, "k_start": 0, "window": None,
          "num_heads": 4, "num_kv_heads": 1, "probs": [[[1.0, 0.0], [0.5, 0.5]]]}
    html = viz.attention_html([ev], 5, 0, sliding_windows=windows)
    assert "global layer: full causal attention" in html
    assert "local (sliding window 512 tokens): layers 0–4, 6–10" in html
    assert "global (full attention): layers 5, 11" in html
    local = viz.attention_html([{**ev, "layer": 0, "window": 512}], 0, 0, sliding_windows=windows)
    assert "local layer: sliding window 512 tokens" in local
    model = {"num_layers": 12, "num_heads": 4, "num_kv_heads": 1, "head_dim": 256, "hidden_size": 640,
             "dtype_bytes": 2, "vocab_size": 1000, "block_size": 16, "num_blocks": 8, "dtype": "bfloat16",
             "sliding_windows": windows, "query_pre_attn_scalar": 256, "mlp_activation": "gelu_pytorch_tanh"}
    text = {s.key: s.text for s in journey(model, "r1", None, [], [])}["layers"]
    assert "<b>10</b> of the 12 layers are local" in text and "last <b>512</b> tokens" in text
    assert "layers 0–4, 6–10" in text and "layers 5, 11" in text and "GeGLU" in text and "√256" in text
    plain = {s.key: s.text for s in journey({**model, "sliding_windows": [None] * 12}, "r1", None, [], [])}["layers"]
    assert "local" not in plain
