"""llama.cpp `deepseek2` GGUF files load: tiny random DeepSeek V2 / V3 models written the
way llama.cpp's converter (convert_hf_to_gguf.py, DeepseekV2Model) writes them, then
checked against transformers running the source model (transformers' own GGUF loader does
not read deepseek2), and against the engine loading the same model from safetensors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import LLM, ModelLoadError, SamplingParams
from engine.forward import prompt_logits
from tests.deepseek_tiny import make_deepseek
from tests.engine_utils import DEVICE
from tests.gguf_writer import Q, add_tokenizer, encode
from tests.tiny import load_reference, save_tokenizer

gguf = pytest.importorskip("gguf")
GEN = torch.Generator().manual_seed(7)
PROMPTS = [torch.randint(4, 300, (n,), generator=GEN).tolist() for n in (21, 9)]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

# HF module (under model.layers.N.) -> llama.cpp's name (gguf-py's tensor map for DEEPSEEK2)
NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.q_a_proj": "attn_q_a", "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b", "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp", "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
}


@pytest.fixture(scope="module", autouse=True)
def _own_cache(tmp_path_factory):
    """Converted tokenizers are saved in the model cache: keep these tests' files out of the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOKENTRACE_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


def deepseek2_tensors(model, split_kv_b: bool) -> dict[str, np.ndarray]:
    """The state dict under llama.cpp's names: experts stacked, kv_b_proj cut per head into
    attn_k_b (transposed) and attn_v_b (split_kv_b, as converters since 2025 write it) or
    kept as attn_kv_b (older files)."""
    cfg = model.config
    out = {}
    for name, t in model.state_dict().items():
        w = t.float().numpy().copy()
        top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
               "lm_head.weight": "output.weight"}
        if name in top:
            out[top[name]] = w
            continue
        _, _, layer, rest = name.split(".", 3)
        p = f"blk.{layer}."
        if rest == "mlp.experts.gate_up_proj":
            out[p + "ffn_gate_exps.weight"], out[p + "ffn_up_exps.weight"] = np.split(w, 2, axis=1)
        elif rest == "mlp.experts.down_proj":
            out[p + "ffn_down_exps.weight"] = w
        elif rest == "mlp.gate.e_score_correction_bias":
            out[p + "exp_probs_b.bias"] = w
        elif rest == "self_attn.kv_b_proj.weight" and split_kv_b:
            kv_b = w.reshape(cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, -1)
            out[p + "attn_k_b.weight"] = kv_b[:, :cfg.qk_nope_head_dim].transpose(0, 2, 1).copy()
            out[p + "attn_v_b.weight"] = kv_b[:, cfg.qk_nope_head_dim:].copy()
        elif rest == "self_attn.kv_b_proj.weight":
            out[p + "attn_kv_b.weight"] = w
        else:
            module, suffix = rest.rsplit(".", 1)
            out[f"{p}{NAMES[module]}.{suffix}"] = w
    return out


def write_deepseek2(model, tok_dir, path, split_kv_b: bool = True, qtype=Q.F32):
    """Metadata as DeepseekV2Model.set_gguf_parameters writes it (split_kv_b=False: the
    older layout, with per-head key/value lengths and one attn_kv_b)."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_name("tiny-deepseek")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope = cfg.rope_parameters
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_vocab_size(cfg.vocab_size)
    w.add_leading_dense_block_count(cfg.first_k_dense_replace)
    if cfg.q_lora_rank is not None:
        w.add_q_lora_rank(cfg.q_lora_rank)
    w.add_kv_lora_rank(cfg.kv_lora_rank)
    if split_kv_b:
        w.add_head_count_kv(1)
        w.add_key_length(cfg.kv_lora_rank + cfg.qk_rope_head_dim)
        w.add_value_length(cfg.kv_lora_rank)
        w.add_key_length_mla(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
        w.add_value_length_mla(cfg.v_head_dim)
    else:
        w.add_head_count_kv(cfg.num_attention_heads)
        w.add_key_length(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
        w.add_value_length(cfg.v_head_dim)
    w.add_rope_dimension_count(cfg.qk_rope_head_dim)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_count(cfg.n_routed_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_shared_count(cfg.n_shared_experts)
    w.add_expert_weights_scale(cfg.routed_scaling_factor)
    if cfg.norm_topk_prob:
        w.add_expert_weights_norm(True)
    v3 = cfg.model_type == "deepseek_v3"
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if v3 else gguf.ExpertGatingFuncType.SOFTMAX)
    if cfg.n_group:
        w.add_expert_group_count(cfg.n_group)
        w.add_expert_group_used_count(cfg.topk_group)
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    add_tokenizer(w, tok_dir, cfg.vocab_size, chat_template=True)
    rng = np.random.default_rng(0)
    for name, t in deepseek2_tensors(model, split_kv_b).items():
        data, raw = encode(t, Q.F32 if "ffn_gate_inp" in name else qtype, rng)
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    cache = {}

    def get(variant: str, split_kv_b: bool = True):
        if (variant, split_kv_b) not in cache:
            folder = make_deepseek(variant, tmp_path_factory.mktemp(variant))
            path = write_deepseek2(load_reference(folder), folder, folder / f"{variant}.gguf", split_kv_b)
            cache[variant, split_kv_b] = folder, path
        return cache[variant, split_kv_b]
    return get


@pytest.mark.slow  # writes and loads a GGUF, and transformers on the source model, per case
@pytest.mark.parametrize("variant,split_kv_b", [("v3_moe", True), ("v3_moe", False), ("v2_lite", True),
                                                ("v2_groups_yarn", True)])
def test_deepseek2_gguf_matches_transformers(files, variant, split_kv_b):
    folder, path = files(variant, split_kv_b)
    llm = LLM(path, device=DEVICE, dtype="float32", block_size=4)
    ref = load_reference(folder)
    with torch.no_grad():
        expected = ref(torch.tensor([PROMPTS[0]])).logits[0]
    for chunk in (None, 1, 5):
        torch.testing.assert_close(prompt_logits(llm.engine, PROMPTS[0], chunk), expected, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        want = ref.generate(torch.tensor([PROMPTS[1]]), max_new_tokens=GREEDY.max_tokens, do_sample=False,
                            eos_token_id=None, pad_token_id=0)[0, len(PROMPTS[1]):].tolist()
    assert llm.generate(PROMPTS[1], GREEDY)[0].token_ids == want


@pytest.mark.slow  # writes and loads a GGUF, and transformers on the source model
def test_q8_0_deepseek2_file_matches_its_rounded_source(tmp_path):
    """A quantized file (Q8_0 matrices, as llama.cpp's files are) gives the logits of the source
    model with each of those matrices rounded the same way: only the rounding differs."""
    folder = make_deepseek("v3_moe", tmp_path / "src")
    source = load_reference(folder)
    path = write_deepseek2(source, folder, tmp_path / "q8.gguf", qtype=Q.Q8_0)
    with torch.no_grad():  # what encode() quantized: >= 2-D rows of whole blocks, not the routers
        for name, p in source.named_parameters():
            if p.dim() >= 2 and p.shape[-1] % 32 == 0 and not name.endswith("mlp.gate.weight") \
                    and "kv_b_proj" not in name:  # kv_b is written cut into k_b / v_b, rows too short: F32
                q = gguf.quants.quantize(p.detach().numpy(), Q.Q8_0)
                p.copy_(torch.from_numpy(gguf.quants.dequantize(q, Q.Q8_0)).reshape(p.shape))
        expected = source(torch.tensor([PROMPTS[0]])).logits[0]
        unrounded = load_reference(folder)(torch.tensor([PROMPTS[0]])).logits[0]
    assert not torch.allclose(expected, unrounded, atol=1e-3)  # the rounding shows: the test can fail
    llm = LLM(path, device=DEVICE, dtype="float32", block_size=4)
    for chunk in (None, 1):
        torch.testing.assert_close(prompt_logits(llm.engine, PROMPTS[0], chunk), expected, atol=1e-4, rtol=1e-4)


def test_deepseek2_gguf_config_equals_the_safetensors_one(files):
    """Every field the engine reads from config.json comes back from the file's metadata."""
    folder, path = files("v2_groups_yarn")
    from_gguf = LLM(path, device=DEVICE, dtype="float32").engine.model_config
    from_hf = LLM(folder, device=DEVICE, dtype="float32").engine.model_config
    assert from_gguf.architecture == "DeepseekV2ForCausalLM" and from_gguf.family == "deepseek_v2"
    assert from_gguf.mla.__dict__ | {"scale": 0} == from_hf.mla.__dict__ | {"scale": 0}
    assert abs(from_gguf.mla.scale - from_hf.mla.scale) < 1e-6  # mscale read back from a float32
    assert from_gguf.deepseek_moe == from_hf.deepseek_moe
    assert (from_gguf.kv_layout, from_gguf.moe_layers, from_gguf.num_experts, from_gguf.num_experts_per_tok) == \
        (from_hf.kv_layout, from_hf.moe_layers, from_hf.num_experts, from_hf.num_experts_per_tok)
    assert from_gguf.rope_scaling["rope_type"] == "yarn"
    assert abs(from_gguf.rope_scaling["mscale_all_dim"] - 0.707) < 1e-5
    v3 = LLM(files("v3_moe")[1], device=DEVICE, dtype="float32").engine.model_config
    assert v3.architecture == "DeepseekV3ForCausalLM" and v3.deepseek_moe.correction_bias
    assert (v3.deepseek_moe.n_group, v3.deepseek_moe.topk_group, v3.deepseek_moe.scoring) == (4, 2, "sigmoid")


def rewrite(path, out, drop: str | None = None, fields: dict | None = None):
    """A copy of a GGUF file without the tensor `drop`, with string fields replaced."""
    reader = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(str(out), "deepseek2")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = (fields or {}).get(field.name, field.contents())
        w.add_key_value(field.name, value, field.types[0],
                        field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        if t.name != drop:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_a_half_kv_b_is_a_clear_error(files, tmp_path):
    """attn_k_b without attn_v_b: one ModelLoadError naming the layer, not a missing-weights list."""
    half = rewrite(files("v2_lite")[1], tmp_path / "half.gguf", drop="blk.2.attn_v_b.weight")
    with pytest.raises(ModelLoadError, match=r"blk\.2 has attn_k_b without its other half"):
        LLM(half, device=DEVICE, dtype="float32")


def test_tokenizer_from_the_file(files, tmp_path):
    """The vocabulary, merges, special tokens and chat template come from the file (transformers
    converts no deepseek2 tokenizer itself); "deepseek-v3" files split digits in threes, as
    DeepSeek-V3's tokenizer.json does."""
    from transformers import AutoTokenizer
    folder, path = files("v3_moe")
    text = "The quick brown fox 12345 jumps, naïve café 日本語"
    source = AutoTokenizer.from_pretrained(str(folder))
    tok = LLM(path, device=DEVICE, dtype="float32").tokenizer
    assert tok.encode(text) == source(text).input_ids
    assert tok.hf.eos_token == "</s>" and tok.hf.chat_template == source.chat_template
    v3 = LLM(rewrite(path, tmp_path / "v3pre.gguf", fields={"tokenizer.ggml.pre": "deepseek-v3"}),
             device=DEVICE, dtype="float32").tokenizer
    pieces = v3.hf.backend_tokenizer.pre_tokenizer.pre_tokenize_str("fox 12345")
    assert [p for p, _ in pieces] == ["fox", "Ġ", "123", "45"]
