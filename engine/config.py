"""Model and engine configuration.

`ModelConfig` normalises the many spellings of Hugging Face `config.json` files
(Llama, Mistral, Qwen2/3, Mixtral, Qwen2/3-MoE, OLMoE, Gemma 3) into one flat description
that the model code reads. `EngineConfig` holds the serving knobs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from engine.config_deepseek import DeepseekMoEConfig, MLAConfig
from engine.config_deepseek import from_hf as deepseek_from_hf
from engine.config_support import SUPPORTED_ACTIVATIONS, UnsupportedModelError, read_local_rope, read_rope

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUANTIZATIONS = ("int8", "int4")  # weight-only kinds (engine/layers/quantized.py)
ProgressFn = Callable[[int, int, str], None]  # (done, total, what): model loading's progress

# architecture name in config.json -> family. The family decides the few
# places where these models differ (bias, norms, MoE block layout).
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "OlmoeForCausalLM": "olmoe",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # its language model only (the vision tower is skipped)
    "DeepseekV2ForCausalLM": "deepseek_v2",  # MLA + DeepSeek MoE
    "DeepseekV3ForCausalLM": "deepseek_v3",
}
# model_type -> architecture, for a config.json without `architectures` (transformers'
# AutoModelForCausalLM picks the class from model_type too).
MODEL_TYPES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
}

# Gemma3TextConfig's defaults: config.json files, above all the text_config inside a
# Gemma3ForConditionalGeneration file, often leave these out.
GEMMA3_DEFAULTS = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6,
    "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "bos_token_id": 2, "eos_token_id": 1,
}


@dataclass
class ModelConfig:
    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict | None
    tie_word_embeddings: bool
    qk_norm: str  # "none" | "head" (Qwen3: per head) | "full" (OLMoE: whole projection)
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    clip_qkv: float | None
    sliding_windows: list[int | None]  # per layer; None = full attention
    moe_layers: list[bool]  # per layer: MoE block instead of dense MLP
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    shared_expert_intermediate_size: int = 0
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    torch_dtype: str | None = None
    # Gemma 3; the defaults leave every other family as it was.
    hidden_act: str = "silu"  # the MLP's gate: "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU)
    query_pre_attn_scalar: float | None = None  # attention scale = its -1/2 power (None: head_dim's)
    local_rope_theta: float | None = None  # RoPE of the sliding-window layers, where it differs
    local_rope_scaling: dict | None = None
    norm_offset: bool = False  # RMSNorm scales by (1 + weight)
    sandwich_norms: bool = False  # norms before and after both attention and MLP
    embed_scale: float | None = None  # embeddings multiplied by this (sqrt(hidden_size))
    final_logit_softcapping: float | None = None  # logits -> c * tanh(logits / c)
    # DeepSeek V2/V3: multi-head latent attention and DeepSeek MoE
    mla: MLAConfig | None = None
    deepseek_moe: DeepseekMoEConfig | None = None

    @property
    def rotary_dim(self) -> int:
        """The dims RoPE turns: every head dim, or MLA's decoupled qk_rope_head_dim."""
        return self.mla.qk_rope_head_dim if self.mla is not None else self.head_dim

    @property
    def kv_layout(self) -> tuple[int, int, int]:
        """What the pool keeps per token per layer: (tensors, heads, dims). K and V for every
        KV head, or MLA's one latent (kv_lora_rank + qk_rope_head_dim numbers)."""
        if self.mla is not None:
            return 1, 1, self.mla.latent_dim
        return 2, self.num_kv_heads, self.head_dim

    @property
    def is_moe(self) -> bool:
        return any(self.moe_layers)

    @property
    def attention_scale(self) -> float:
        """What QKᵀ is multiplied by before the softmax: 1/sqrt(head_dim), or Gemma's
        1/sqrt(query_pre_attn_scalar)."""
        if self.mla is not None:
            return self.mla.scale
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def kv_bytes_per_token(self) -> int:
        """What the pool keeps for one token across all layers, in elements (multiply by
        dtype size): K and V, or MLA's latent."""
        kinds, heads, dims = self.kv_layout
        return kinds * self.num_layers * heads * dims

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "ModelConfig":
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in ARCHITECTURES), None)
        if arch is None and not archs:
            arch = MODEL_TYPES.get(cfg.get("model_type"))
        if arch is None:
            raise UnsupportedModelError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}; "
                f"supported: {', '.join(ARCHITECTURES)}")
        family = ARCHITECTURES[arch]
        if family == "gemma3":
            cfg = _gemma3_text_config(cfg)
        if family.startswith("deepseek"):
            return deepseek_from_hf(cls, arch, family, cfg)  # MLA's and DeepSeek MoE's fields
        act = cfg.get("hidden_activation" if family == "gemma3" else "hidden_act") or "silu"
        if act not in SUPPORTED_ACTIVATIONS:
            raise UnsupportedModelError(
                f"unsupported hidden activation {act!r}; supported: {', '.join(SUPPORTED_ACTIVATIONS)}")
        n_layers = cfg["num_hidden_layers"]
        n_heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
        rope_theta, rope_scaling = read_rope(cfg)
        local_rope_theta, local_rope_scaling = read_local_rope(cfg)

        # MoE layout: which layers are sparse, and the block's shape.
        num_experts = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
        moe_layers = [False] * n_layers
        if num_experts:
            if family == "mixtral" or family == "olmoe":
                moe_layers = [True] * n_layers
            else:  # qwen2_moe / qwen3_moe
                step = cfg.get("decoder_sparse_step", 1) or 1
                only_mlp = set(cfg.get("mlp_only_layers") or [])
                moe_layers = [i not in only_mlp and (i + 1) % step == 0 for i in range(n_layers)]
        norm_topk = True if family == "mixtral" else bool(cfg.get("norm_topk_prob", False))

        eos = cfg.get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        return cls(
            architecture=arch,
            family=family,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            num_layers=n_layers,
            num_heads=n_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or n_heads,
            head_dim=head_dim,
            intermediate_size=cfg.get("intermediate_size", 0),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qk_norm={"qwen3": "head", "qwen3_moe": "head", "olmoe": "full", "gemma3": "head"}.get(family, "none"),
            clip_qkv=cfg.get("clip_qkv"),
            # transformers hard-codes Q/K/V bias for Qwen2, reads qkv_bias (default on) for
            # Qwen2-MoE, and attention_bias for the others.
            qkv_bias=family == "qwen2" or (bool(cfg.get("qkv_bias", True)) if family == "qwen2_moe"
                                           else bool(cfg.get("attention_bias", False))),
            o_bias=family not in ("qwen2", "qwen2_moe") and bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            sliding_windows=_sliding_windows(cfg, family, n_layers),
            moe_layers=moe_layers,
            num_experts=num_experts,
            num_experts_per_tok=cfg.get("num_experts_per_tok", 0) if num_experts else 0,
            moe_intermediate_size=(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size", 0))
            if num_experts else 0,
            norm_topk_prob=norm_topk,
            shared_expert_intermediate_size=cfg.get("shared_expert_intermediate_size", 0)
            if family == "qwen2_moe" else 0,
            eos_token_ids=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
            torch_dtype=cfg.get("dtype") or cfg.get("torch_dtype"),
            hidden_act="silu" if act == "swish" else act,
            query_pre_attn_scalar=cfg.get("query_pre_attn_scalar") if family == "gemma3" else None,
            local_rope_theta=local_rope_theta,
            local_rope_scaling=local_rope_scaling,
            norm_offset=family == "gemma3",
            sandwich_norms=family == "gemma3",
            embed_scale=cfg["hidden_size"] ** 0.5 if family == "gemma3" else None,
            final_logit_softcapping=cfg.get("final_logit_softcapping"),
        )


def _gemma3_text_config(cfg: dict) -> dict:
    """A Gemma 3 config with Gemma3TextConfig's defaults filled in; for the multimodal
    Gemma3ForConditionalGeneration, its text_config (the vision tower is not run)."""
    top = {k: cfg[k] for k in ("eos_token_id", "bos_token_id", "dtype", "torch_dtype", "tie_word_embeddings")
           if cfg.get(k) is not None}
    cfg = {**GEMMA3_DEFAULTS, **(cfg.get("text_config") or cfg), **top}
    if cfg.get("attn_logit_softcapping") is not None:
        raise UnsupportedModelError("attention logit soft-capping (attn_logit_softcapping) is not supported")
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedModelError("bidirectional attention (an embedding model) is not supported")
    return cfg


def _sliding_windows(cfg: dict, family: str, n_layers: int) -> list[int | None]:
    window = cfg.get("sliding_window")
    if family in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not cfg.get("use_sliding_window", False):
        window = None
    if not window or family in ("llama", "olmoe"):
        return [None] * n_layers
    if cfg.get("layer_types"):  # explicit per-layer list (transformers >= 4.5x)
        return [window if t == "sliding_attention" else None for t in cfg["layer_types"]]
    if family == "gemma3":  # every `sliding_window_pattern`-th layer is global, the others local
        pattern = cfg.get("sliding_window_pattern") or 6
        return [window if (i + 1) % pattern else None for i in range(n_layers)]
    # Older files: each family's own rule, as transformers derives layer_types.
    max_window_layers = cfg.get("max_window_layers", n_layers)
    if family in ("qwen2", "qwen3"):
        return [window if i >= max_window_layers else None for i in range(n_layers)]
    if family == "qwen2_moe":
        return [window if (i + 1) % 2 and i < max_window_layers else None for i in range(n_layers)]
    return [window] * n_layers  # mistral, mixtral, qwen3_moe


BATCHING_POLICIES = ("continuous", "static")


@dataclass
class EngineConfig:
    """Serving knobs. KV pool size: `num_kv_blocks`, else `kv_cache_memory_fraction`
    of the free device memory, else a default that fits `max_num_seqs` full contexts
    (capped at `kv_cache_max_bytes`)."""
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_fraction: float | None = None
    kv_cache_max_bytes: int = 1 << 30
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512  # per-step token budget (chunked prefill)
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    use_triton: bool | None = None  # None: on CUDA when triton imports
    freeze_startup_heap: bool = True  # hide objects alive before the first engine from the GC (see llm_engine)
    tensor_parallel_size: int = 1  # ranks the model is split over (engine/parallel)
    expert_parallel: bool = False  # MoE blocks: whole experts on ranks instead of split experts
    quantization: str | None = None  # "int8" / "int4": weight-only quantized linear layers, CPU (engine/checkpoint/quantize.py)
    # decode steps replayed from CUDA graphs (engine/cuda_graph.py). None: on for CUDA with the
    # Triton kernels; False: always eager (vLLM's enforce_eager). Sizes: None = 1, 2, 4, 8, 16, 32
    # up to max_num_seqs
    cuda_graphs: bool | None = None
    cuda_graph_sizes: tuple[int, ...] | None = None
    # "continuous" (requests join and leave every step) or "static" (engine/static_batching.py:
    # a batch runs until its longest request ends; kept to measure against, app/lab)
    batching: str = "continuous"

    def __post_init__(self) -> None:
        self.quantization = check_quantization(self.quantization)
        if self.batching not in BATCHING_POLICIES:
            raise ValueError(f"batching must be one of {', '.join(BATCHING_POLICIES)}, got {self.batching!r}")
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a positive power of two, got {self.block_size}")
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive")
        if self.kv_cache_memory_fraction is not None and not 0 < self.kv_cache_memory_fraction <= 1:
            raise ValueError("kv_cache_memory_fraction must be in (0, 1]")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.cuda_graph_sizes is not None and (not self.cuda_graph_sizes or min(self.cuda_graph_sizes) < 1):
            raise ValueError(f"cuda_graph_sizes must be batch sizes >= 1, got {self.cuda_graph_sizes}")
        if self.cuda_graphs and (self.tensor_parallel_size > 1 or self.expert_parallel):
            raise ValueError("cuda_graphs=True on a sharded model (engine/parallel) is not built")
        if self.quantization is not None and self.tensor_parallel_size > 1:  # the shards load float weights
            raise ValueError(f"quantization={self.quantization!r} with tensor_parallel_size="
                             f"{self.tensor_parallel_size} is not built: use one or the other")


def check_quantization(kind: str | None) -> str | None:
    if kind in (None, "", "none"):
        return None
    if kind not in QUANTIZATIONS:
        raise ValueError(f"unsupported quantization {kind!r}; choose one of {', '.join(QUANTIZATIONS)} (or none)")
    return kind
