"""Read a llama.cpp GGUF file: its metadata as a Hugging Face config dict, and its
tensors under Hugging Face checkpoint names, dequantized and in HF layout.

llama.cpp's converter renames every tensor, stacks MoE experts, permutes Llama's
Q/K rows for its interleaved RoPE, stores Gemma's norms as 1 + w and Llama 3's RoPE
scaling as a tensor of divisors. Each of those is undone here, as transformers' own
GGUF loader does, so the rest of the engine sees an ordinary checkpoint.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import torch

from engine.checkpoint import gguf_deepseek2
from engine.checkpoint.errors import ModelLoadError
from engine.checkpoint.gguf_reader import close_gguf, first_line, is_gguf, meta, open_gguf  # noqa: F401 - all read from here
from engine.layers.rotary import inverse_frequencies

if TYPE_CHECKING:
    from gguf import GGUFReader, ReaderTensor

# general.architecture -> (transformers architecture, model_type)
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),  # Mixtral too: a llama file with experts
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe"),
    "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
    "deepseek2": ("DeepseekV2ForCausalLM", "deepseek_v2"),  # V3 too: see gguf_deepseek2.config
}

# GGUF tensor names -> HF names. Per block: blk.N.<kind>.weight|bias -> model.layers.N.<module>.
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",  # the MoE router
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# Gemma 3 has four norms per block; llama.cpp's ffn_norm is the one before the MLP there.
_GEMMA_BLOCK = {**_BLOCK, "ffn_norm": "pre_feedforward_layernorm",
                "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
# Stacked experts [E, out, in]: split into the per-expert names `checkpoint_target` knows.
_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_NOT_WEIGHTS = {"rope_freqs.weight"}  # read into the config (Llama 3 RoPE scaling)

# --- config ----------------------------------------------------------------------

def read_config(path: Path) -> dict[str, Any]:
    """The file's metadata as a config.json-style dict that `ModelConfig.from_hf` reads."""
    reader = open_gguf(path)
    arch = meta(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r} (general.architecture) in {path.name}; "
                             f"supported: {', '.join(ARCHITECTURES)}")
    _check_quant_types(reader, path)
    tensors = {t.name: t for t in reader.tensors}

    def key(name: str, default: Any = None) -> Any:
        return meta(reader, f"{arch}.{name}", default)

    for name in ("block_count", "attention.head_count", "embedding_length"):
        if key(name) is None:
            raise ModelLoadError(f"GGUF file {path.name} lacks {arch}.{name}")
    hf_arch, model_type = ARCHITECTURES[arch]
    n_layers, n_heads, hidden = key("block_count"), key("attention.head_count"), key("embedding_length")
    head_dim = key("attention.key_length") or hidden // n_heads
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    embed = tensors.get("token_embd.weight")
    cfg: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": model_type,
        # as transformers reads it: the stated size, else the tokenizer's
        "vocab_size": key("vocab_size") or (len(tokens.data) if tokens else None)
        or (int(embed.shape[1]) if embed is not None else None),
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length", 0),
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": key("attention.head_count_kv") or n_heads,
        "head_dim": head_dim,
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-6),
        "max_position_embeddings": key("context_length", 2048),
        "rope_theta": key("rope.freq_base", 1e6 if arch == "gemma3" else 10000.0),
        "rope_scaling": _rope_scaling(reader, arch),
        # llama.cpp writes the output projection only when it is not the embedding matrix
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": "blk.0.ffn_up.bias" in tensors,
        "bos_token_id": meta(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _stop_ids(reader),
        "pad_token_id": meta(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": _file_dtype(reader),
    }
    rope_dims = key("rope.dimension_count")
    if rope_dims and rope_dims != head_dim:  # partial rotary: from_hf says it is unsupported
        cfg["partial_rotary_factor"] = rope_dims / head_dim
    if "rope_freqs.weight" in tensors:
        cfg["rope_scaling"] = _llama3_scaling(tensors["rope_freqs.weight"], head_dim, cfg["rope_theta"], path)

    if arch == "deepseek2":
        del cfg["head_dim"]  # the file's key_length is the latent's (MQA over it), not a head's
        cfg.pop("partial_rotary_factor", None)
        cfg.update(gguf_deepseek2.config(key, tensors, cfg, n_heads))
    elif key("expert_count"):
        cfg.update(_moe_config(arch, key, tensors, n_layers))
        if arch == "llama":
            cfg["architectures"], cfg["model_type"] = ["MixtralForCausalLM"], "mixtral"
            cfg["intermediate_size"] = cfg["moe_intermediate_size"]
    if arch == "qwen2moe":
        cfg["qkv_bias"] = "blk.0.attn_q.bias" in tensors
    if arch == "gemma3":
        cfg.update(_gemma3_config(key, n_layers, hidden, n_heads, head_dim))  # rope_scaling: global layers only
    return cfg


def _moe_config(arch: str, key, tensors: dict, n_layers: int) -> dict[str, Any]:
    def width(name: str, fallback: int) -> int:  # a size the metadata may omit, from a tensor's shape
        t = tensors.get(name)
        return int(t.shape[1]) if t is not None else fallback

    experts = key("expert_count")
    out: dict[str, Any] = {
        "num_local_experts" if arch == "llama" else "num_experts": experts,
        "num_experts_per_tok": key("expert_used_count"),
        "moe_intermediate_size": key("expert_feed_forward_length") or width("blk.0.ffn_gate_exps.weight", 0),
        # llama.cpp makes every block sparse; a file that does not is read as it is
        "decoder_sparse_step": 1,
        "mlp_only_layers": [i for i in range(n_layers) if f"blk.{i}.ffn_gate_inp.weight" not in tensors],
    }
    if arch == "qwen2moe":
        out["shared_expert_intermediate_size"] = (key("expert_shared_feed_forward_length")
                                                  or width("blk.0.ffn_up_shexp.weight", 0))
    # llama.cpp renormalises the top-k weights for Qwen3-MoE, not for Qwen2-MoE
    out["norm_topk_prob"] = bool(key("expert_weights_norm", arch == "qwen3moe"))
    return out


def _gemma3_config(key, n_layers: int, hidden: int, n_heads: int, head_dim: int) -> dict[str, Any]:
    """The Gemma3TextConfig fields the file does not state: llama.cpp hard-codes them."""
    pattern = key("attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # newer files: one flag per layer, True = sliding
        sliding = [bool(p) for p in pattern]
    else:  # every `pattern`-th layer is global
        sliding = [(i + 1) % pattern != 0 for i in range(n_layers)]
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": key("attention.sliding_window", 4096),
        "sliding_window_pattern": pattern if isinstance(pattern, int) else None,
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "rope_local_base_freq": key("rope.freq_base_swa", 10000.0),
        # llama.cpp scales queries by 1/sqrt(head_dim), except for the 27B (62 layers)
        "query_pre_attn_scalar": hidden // n_heads if n_layers == 62 else head_dim,
        "final_logit_softcapping": key("final_logit_softcapping"),
        "attn_logit_softcapping": key("attn_logit_softcapping"),
    }


def _rope_scaling(reader: "GGUFReader", arch: str) -> dict | None:
    kind = meta(reader, f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    out = {"rope_type": kind, "factor": float(meta(reader, f"{arch}.rope.scaling.factor", 1.0))}
    if original := meta(reader, f"{arch}.rope.scaling.original_context_length"):
        out["original_max_position_embeddings"] = original
    return out


def _llama3_scaling(t: "ReaderTensor", head_dim: int, theta: float, path: Path) -> dict | None:
    """llama.cpp stores Llama 3's RoPE scaling as its result: one divisor per frequency.
    Recover parameters that give exactly those divisors (only the ratios of the original
    context length to the two frequency factors matter, so low/high are fixed at 1 and 4)."""
    divisors = torch.from_numpy(np.array(t.data, dtype=np.float32)).double()
    factor = float(divisors.max())
    if factor <= 1.0 + 1e-6:
        return None
    inv_freq = inverse_frequencies(head_dim, theta, None).double()
    wavelen = 2 * torch.pi / inv_freq
    # in between, 1/divisor = (1 - s)/factor + s with s = (old_len/wavelen - 1)/3
    between = (divisors > 1 + 1e-4) & (divisors < factor - 1e-4)
    smooth = (1 / divisors - 1 / factor) / (1 - 1 / factor)
    candidates = [float(((3 * smooth + 1) * wavelen)[between].median())] if between.any() else \
        [8192.0, float(wavelen[divisors >= factor - 1e-4].min())]
    for old_len in candidates:
        scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": old_len}
        if torch.allclose(inv_freq / inverse_frequencies(head_dim, theta, scaling).double(), divisors, rtol=1e-4):
            return scaling
    raise ModelLoadError(f"rope_freqs.weight in {path.name} is not a Llama 3 RoPE scaling this engine can reproduce")


def _stop_ids(reader: "GGUFReader") -> int | list[int] | None:
    # llama.cpp also stops at the end-of-turn / end-of-message tokens a file names
    ids = [meta(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    ids = list(dict.fromkeys(i for i in ids if i is not None))
    return ids[0] if len(ids) == 1 else (ids or None)


def _file_dtype(reader: "GGUFReader") -> str | None:
    """The float type of an unquantized file's matrices (norms are F32 in every file)."""
    types = {t.tensor_type.name for t in reader.tensors if len(t.shape) > 1}
    for names, dtype in (({"F32"}, "float32"), ({"F32", "F16"}, "float16"), ({"F32", "BF16"}, "bfloat16")):
        if types <= names:
            return dtype
    return None  # quantized: the engine's default for the device


def _check_quant_types(reader: "GGUFReader", path: Path) -> None:
    """Fail before the long load if a tensor's type cannot be dequantized."""
    from gguf import dequantize

    seen = set()
    for t in reader.tensors:
        if t.tensor_type not in seen:
            seen.add(t.tensor_type)
            try:
                dequantize(t.data.reshape(-1, t.data.shape[-1])[:1], t.tensor_type)
            except NotImplementedError:
                raise ModelLoadError(f"unsupported GGUF quantization type {t.tensor_type.name} (tensor {t.name} "
                                     f"in {path.name}): the gguf package cannot dequantize it") from None


# --- tensors ---------------------------------------------------------------------

def read_tensors(path: Path, codes: dict | None = None) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
    """How many tensors the file yields, and the tensors as (HF name, float32 tensor).
    codes: if given, also filled with the raw codes of every Q8_0 / Q4_0 / Q4_1 matrix, as
    {HF name: (codes, d, m, type)} (see `block_codes`), for quantized layers that use them as
    they are."""
    reader = open_gguf(path)
    count = sum(_num_experts(t) or 1 for t in reader.tensors if t.name not in _NOT_WEIGHTS)
    count -= sum(t.name.endswith(".attn_k_b.weight") for t in reader.tensors)  # joined with attn_v_b
    return count, _tensors(reader, path, codes)


def _num_experts(t: "ReaderTensor") -> int:
    m = _BLOCK_RE.match(t.name)
    return int(t.shape[-1]) if m and m.group(2) in _EXPERTS else 0  # GGUF dims: [in, out, experts]


def _tensors(reader: "GGUFReader", path: Path, codes: dict | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    arch = meta(reader, "general.architecture")
    n_heads = meta(reader, f"{arch}.attention.head_count")
    n_kv_heads = meta(reader, f"{arch}.attention.head_count_kv") or n_heads
    names = _GEMMA_BLOCK if arch == "gemma3" else _BLOCK
    kv_b = gguf_deepseek2.KVBJoiner()
    for t in reader.tensors:
        if t.name in _NOT_WEIGHTS:
            continue
        w = _dequantize(t, path)
        if arch == "gemma3" and t.name.endswith("norm.weight"):
            w = w - 1  # llama.cpp stores Gemma's (1 + w) norm scales with the 1 added
        m = _BLOCK_RE.match(t.name)
        if m is None:
            stem, _, suffix = t.name.rpartition(".")
            name = f"{_TOP[stem]}.{suffix}" if stem in _TOP else t.name
            # an untied LM head, or the embedding a tied one shares
            if codes is not None and stem in ("output", "token_embd") and (q := block_codes(t)) is not None:
                codes[name] = q
            yield name, w
            continue
        layer, kind, suffix = m.groups()
        prefix = f"model.layers.{layer}."
        if kind in _EXPERTS:
            for e in range(w.shape[0]):
                yield f"{prefix}mlp.experts.{e}.{_EXPERTS[kind]}.{suffix}", w[e]
            continue
        q = block_codes(t) if codes is not None and suffix == "weight" else None
        if arch == "llama" and kind in ("attn_q", "attn_k"):
            w = _unpermute(w, n_heads if kind == "attn_q" else n_kv_heads)
            if q is not None:  # a permutation of rows: codes and their scales move with them
                q = tuple(a if a is None else _unpermute(a, n_heads if kind == "attn_q" else n_kv_heads)
                          for a in q[:3]) + q[3:]
        if arch == "deepseek2":
            if kind in gguf_deepseek2.SPLIT_KV_B:
                if (joined := kv_b.add(layer, kind, w)) is not None:
                    yield f"{prefix}self_attn.kv_b_proj.weight", joined
                continue
            name = gguf_deepseek2.block_name(prefix, kind, suffix) or t.name
            if q is not None:
                codes[name] = q
            yield name, w
            continue
        if kind == "ffn_gate_inp_shexp":
            w = w.reshape(1, -1)  # [hidden] in the file, a Linear(hidden, 1) in the model
        name = f"{prefix}{names[kind]}.{suffix}" if kind in names else t.name
        if q is not None:
            codes[name] = q
        yield name, w
    kv_b.check_done()


def _dequantize(t: "ReaderTensor", path: Path) -> torch.Tensor:
    from gguf import dequantize

    try:
        array = dequantize(t.data, t.tensor_type)
    except (NotImplementedError, ValueError) as e:
        raise ModelLoadError(
            f"cannot dequantize tensor {t.name} ({t.tensor_type.name}) in {path.name}: {first_line(e)}") from e
    if not array.flags.writeable:  # F32 comes back as a view of the read-only file mapping
        array = array.copy()
    return torch.from_numpy(array.astype(np.float32, copy=False)).reshape(tuple(int(d) for d in reversed(t.shape)))


# bytes per block of 32 weights: a float16 d (and m for Q4_1), then the codes (4-bit: 16 bytes, 8-bit: 32)
_BLOCKS = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def block_codes(t: "ReaderTensor") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, str] | None:
    """A Q8_0 / Q4_0 / Q4_1 matrix's blocks as codes [N, K] with one scale d and offset m
    per block [N, K/32], and the type's name; None for other types.
    Q8_0: int8 codes, w = q * d (m is None). Q4_1: codes 0..15, w = q * d + m.
    Q4_0: codes 0..15, w = (q - 8) * d, so m = -8d."""
    size = _BLOCKS.get(t.tensor_type.name)
    if size is None or len(t.shape) != 2:
        return None
    rows = int(t.shape[1])
    blocks = np.asarray(t.data, dtype=np.uint8).reshape(rows, -1, size)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = None
    if size == 34:
        codes = blocks[..., 2:].copy().view(np.int8).reshape(rows, -1)
    else:
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if size == 20 else -8 * d
        qs = blocks[..., size - 16:]
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, -1)  # low nibbles are weights 0..15
    return torch.from_numpy(codes), torch.from_numpy(d), None if m is None else torch.from_numpy(m), t.tensor_type.name


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation: it reorders each head's rows from
    rotate-half pairs (i, i + d/2) to interleaved pairs (2i, 2i + 1) for its RoPE."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
