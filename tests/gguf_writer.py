"""Tiny random models written as GGUF files the way llama.cpp's converter writes them
(renamed tensors, Llama's Q/K rows permuted, stacked experts, Gemma norms + 1, quantized
blocks, a byte-level BPE vocabulary and a chat template), for the GGUF and quantization tests."""
import json
import math

import numpy as np
import pytest
import torch

from tests.tiny import VOCAB, scale_weights

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

# HF module -> llama.cpp tensor name, per block (convert_hf_to_gguf's tensor map)
BLOCK_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
GEMMA_BLOCK_NAMES = {**BLOCK_NAMES, "post_attention_layernorm": "post_attention_norm",
                     "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
GGUF_ARCH = {"llama": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
             "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gemma3_text": "gemma3"}



def tiny_model(cls_name: str, seed: int = 0, hidden: int = 64, inter: int = 96, layers: int = 3, **extra):
    import transformers
    cfg = getattr(transformers, cls_name)(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=None, **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    scale_weights(model, seed)
    return model.eval()


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: rotate-half rows -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_k_blocks(shape: tuple[int, ...], qtype, rng: np.random.Generator) -> np.ndarray:
    """K-quant bytes (the gguf package cannot quantize these): random blocks with scales
    chosen so the dequantized values have std ~ 1/sqrt(fan_in)."""
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    *lead, cols = shape
    raw = rng.integers(0, 256, (*lead, cols // block, nbytes), dtype=np.uint8)
    d = np.float16(1 / math.sqrt(cols) / {Q.Q4_K: 258, Q.Q5_K: 516}.get(qtype, 1370))
    if qtype in (Q.Q4_K, Q.Q5_K):  # d, dmin, 12 bytes of 6-bit scales/mins, then 4-bit values (Q5_K: + high bits)
        raw[..., 0:2] = np.frombuffer(d.tobytes(), np.uint8)
        raw[..., 2:4] = np.frombuffer(np.float16((7.5 if qtype == Q.Q4_K else 15.5) * d).tobytes(), np.uint8)
    else:  # Q6_K: 6-bit values, int8 scales, d last
        raw[..., -2:] = np.frombuffer(d.tobytes(), np.uint8)
    return raw.reshape(*lead, -1)


def encode(w: np.ndarray, qtype, rng: np.random.Generator) -> tuple[np.ndarray, object]:
    """(data, raw dtype) as llama.cpp stores a tensor: vectors and rows that do not fill a
    quantization block stay F32, like the routers (F32 in llama.cpp's files)."""
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if w.ndim < 2 or w.shape[-1] % block or qtype == Q.F32:
        return w.astype(np.float32), Q.F32
    if qtype == Q.F16:
        return w.astype(np.float16), Q.F16
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        return random_k_blocks(w.shape, qtype, rng), qtype
    return gguf.quants.quantize(w.astype(np.float32), qtype), qtype


def gguf_tensors(model) -> dict[str, np.ndarray]:
    """The model's state dict under llama.cpp's names and layouts, unquantized."""
    cfg = model.config
    arch = GGUF_ARCH[cfg.model_type]
    names = GEMMA_BLOCK_NAMES if arch == "gemma3" else BLOCK_NAMES
    out = {}
    for name, t in model.state_dict().items():
        w = t.float().numpy().copy()
        if name == "lm_head.weight":
            if cfg.tie_word_embeddings:
                continue  # llama.cpp writes no output tensor for a tied model
            out["output.weight"] = w
            continue
        if name in ("model.embed_tokens.weight", "model.norm.weight"):
            out[{"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}[name]] = \
                w + 1 if arch == "gemma3" and "norm" in name else w
            continue
        _, _, layer, rest = name.split(".", 3)
        prefix = f"blk.{layer}."
        if rest == "mlp.experts.gate_up_proj":  # [E, 2I, H] -> stacked gate and up
            gate, up = np.split(w, 2, axis=1)
            out[prefix + "ffn_gate_exps.weight"], out[prefix + "ffn_up_exps.weight"] = gate, up
            continue
        if rest == "mlp.experts.down_proj":
            out[prefix + "ffn_down_exps.weight"] = w
            continue
        module, suffix = rest.rsplit(".", 1)
        if arch == "llama" and module in ("self_attn.q_proj", "self_attn.k_proj"):
            w = llama_cpp_permute(w, cfg.num_attention_heads if "q_proj" in module else cfg.num_key_value_heads)
        if arch == "gemma3" and module.endswith("norm"):
            w = w + 1  # llama.cpp stores Gemma's norm as 1 + weight
        if module == "mlp.shared_expert_gate":
            w = w.reshape(-1)
        out[f"{prefix}{names[module]}.{suffix}"] = w
    return out


def write_gguf(model, tok_dir, path, qtype=Q.F32, chat_template: bool = True, arch: str | None = None,
               extra_tensors: dict | None = None, seed: int = 0):
    cfg = model.config
    arch = arch or GGUF_ARCH[cfg.model_type]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    w.add_rope_freq_base(rope["rope_theta"])
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if arch == "llama":
        w.add_vocab_size(cfg.vocab_size)
        w.add_rope_dimension_count(head_dim)
    else:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        if getattr(cfg, "moe_intermediate_size", None):
            w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        if getattr(cfg, "shared_expert_intermediate_size", None):
            w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    if arch == "gemma3":
        w.add_sliding_window(cfg.sliding_window)
    add_tokenizer(w, tok_dir, cfg.vocab_size, chat_template)
    tensors = {**gguf_tensors(model), **(extra_tensors or {})}
    for name, t in tensors.items():
        data, raw = encode(t, Q.F32 if "ffn_gate_inp" in name else qtype, rng)
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def add_tokenizer(w, tok_dir, vocab_size: int, chat_template: bool) -> None:
    """The tiny byte-level BPE tokenizer as tokenizer.ggml.* keys (model "gpt2")."""
    data = json.loads((tok_dir / "tokenizer.json").read_text())
    vocab = {**data["model"]["vocab"], **{t["content"]: t["id"] for t in data["added_tokens"]}}
    by_id = {i: t for t, i in vocab.items()}
    special = {t["id"] for t in data["added_tokens"] if t["special"]}
    # llama.cpp pads the vocabulary to the embedding's rows with unused [PADn] tokens
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = [3 if i in special else 1 if i in by_id else 5 for i in range(vocab_size)]  # 3 control, 5 unused
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(json.loads((tok_dir / "tokenizer_config.json").read_text()).get("chat_template")
                            or (tok_dir / "chat_template.jinja").read_text())
