"""What an engine is and what it is doing, for whoever serves it: `LLMEngine.describe()`
(fixed once it is built: the model's shape, the KV pool, speculation, the parallel layout,
quantization, CUDA graphs) and `LLMEngine.load()` (now: requests, blocks, counters).
Plain dataclasses, so a server reads them without touching the engine's parts, and
`as_dict()` is what it may send on as JSON."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from engine.config import ModelConfig
from engine.kernels.cpu import blocked_bytes
from engine.model_runner import ModelRunner
from engine.parallel.shard import check_shardable
from engine.speculative.draft import Speculator
from engine.speculative.proposer import Proposer


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    num_experts: int  # 0: dense
    experts_per_token: int  # the router's top-k
    moe_layers: list[int]  # indices of the layers with a MoE block
    sliding_windows: list[int | None]  # per layer; None: full attention
    query_pre_attn_scalar: float | None  # attention scale = its -1/2 power (None: head_dim's)
    mlp_activation: str
    dtype: str  # of the weights, e.g. "float32" (CPU bfloat16 / float16: the pass computes in float32)
    device: str
    max_model_len: int  # the context: prompt + output tokens
    weights_bytes: int  # parameters, buffers and the CPU kernels' blocked weights in memory (on rank 0 when sharded)
    kernel_weight_bytes: int  # of those, the CPU kernels' blocked weights, each the only copy (blocked_bytes)
    # DeepSeek: MLA's ranks and head dims (engine/config_deepseek.MLAConfig: q_lora_rank, kv_lora_rank,
    # qk_nope_head_dim, qk_rope_head_dim, v_head_dim, rope_interleave, scale), and its MoE's routing
    # (n_shared_experts, scoring, topk_method, n_group, topk_group, routed_scaling_factor, correction_bias)
    mla: dict | None = None
    deepseek_moe: dict | None = None


@dataclass(frozen=True)
class KVPoolInfo:
    num_blocks: int
    block_size: int  # tokens per block
    tokens: int  # num_blocks * block_size
    bytes_per_value: int
    # 2 x layers x KV heads x head_dim x bytes_per_value (all ranks together); MLA: layers x latent x bytes
    bytes_per_token: int
    bytes: int  # the pool as allocated in this process (rank 0's share when sharded)
    prefix_caching: bool
    stores: str = "K and V"  # what a slot holds: "K and V", or "latent" (MLA)
    values_per_token_layer: int = 0  # numbers a slot holds per layer: 2 x KV heads x head_dim, or the latent's
    # MLA: what K and V of every head would take a token (layers x heads x (qk + v head dims) x bytes): the
    # ratio the latent saves. 0 where the pool keeps K and V themselves
    full_kv_bytes_per_token: int = 0
    dtype: str = ""  # the pool's, e.g. "float32" (CPU bfloat16 weights keep a float32 pool)

    def summary(self) -> str:
        """One line, e.g. "latent: 576 numbers a token a layer (1/71 of full K and V)"."""
        what = f"{self.stores}: {self.values_per_token_layer:,} numbers a token a layer"
        if self.full_kv_bytes_per_token:
            what += f" (1/{self.full_kv_bytes_per_token / self.bytes_per_token:.0f} of full K and V)"
        return what


@dataclass(frozen=True)
class SpeculationInfo:
    method: str  # "draft" (a draft model) or "ngram" (prompt lookup, no second model)
    num_speculative_tokens: int  # k: proposals verified per round, at most
    draft: ModelShape | None  # the draft model (None for ngram)
    draft_kv_bytes: int  # the draft's own KV pool (0 for ngram)


@dataclass(frozen=True)
class ParallelInfo:
    tensor_parallel_size: int
    expert_parallel: bool
    placement: dict | None  # rank -> heads, KV heads, experts, MLP columns (Placement.as_dict); None: one device
    split_sizes: list[int]  # the tensor-parallel sizes (2 and up) this model can be split into


@dataclass(frozen=True)
class QuantizationInfo:
    kind: str  # "int8" | "int4"
    bytes: int  # codes and scales
    summary: str  # one line: where the codes came from, which kernels run them


@dataclass(frozen=True)
class EngineInfo:
    model: ModelShape
    kv_pool: KVPoolInfo
    speculation: SpeculationInfo | None  # None: no speculative decoding
    parallel: ParallelInfo
    quantization: QuantizationInfo | None  # None: float weights
    cuda_graphs: list[int] | None  # batch sizes whose decode steps replay a CUDA graph; None: eager

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EngineLoad:
    """The engine now (read under its lock): what a metrics endpoint or a status line shows."""
    running: int  # requests being computed
    waiting: int  # queued for KV blocks or a batch slot
    blocks_used: int  # referenced by live requests
    blocks_cached: int  # unreferenced, still holding a prefix the cache can serve
    blocks_free: int  # holding nothing
    steps: int
    target_passes: int  # forward passes of the target model
    generated_tokens: int
    aborted: int
    prefix_queried_tokens: int  # prompt tokens looked up in the prefix cache
    prefix_hit_tokens: int  # of those, found there
    spec_proposed: int
    spec_accepted: int

    def as_dict(self) -> dict:
        return asdict(self)


def describe(runner: ModelRunner, spec: Proposer | None, num_speculative_tokens: int,
             max_model_len: int) -> EngineInfo:
    """An engine from its parts: the target's runner (plain or sharded), the proposer."""
    cfg, ecfg = runner.cfg, runner.ecfg
    speculation = None
    if spec is not None:
        draft = spec.runner if isinstance(spec, Speculator) else None
        speculation = SpeculationInfo(spec.method, num_speculative_tokens,
                                      model_shape(draft, max_model_len) if draft else None,
                                      draft.kv_cache_bytes if draft else 0)
    q = getattr(runner.model, "quantization", None)  # set by engine/checkpoint/weights.py, None for float
    placement = runner.placement  # None on one device (engine/parallel's runner has one)
    graphs = runner.decode_graphs  # None unless captured (never on a sharded runner)
    itemsize = runner.kv_cache.element_size()
    kinds, heads, dims = cfg.kv_layout
    full = 0 if cfg.mla is None else \
        cfg.num_layers * cfg.num_heads * (cfg.mla.qk_head_dim + cfg.mla.v_head_dim) * itemsize
    return EngineInfo(
        model=model_shape(runner, max_model_len),
        kv_pool=KVPoolInfo(runner.num_blocks, ecfg.block_size, runner.num_blocks * ecfg.block_size, itemsize,
                           cfg.kv_bytes_per_token * itemsize, runner.kv_cache_bytes, ecfg.enable_prefix_caching,
                           "latent" if cfg.mla is not None else "K and V", kinds * heads * dims, full,
                           str(runner.kv_cache.dtype).replace("torch.", "")),
        speculation=speculation,
        parallel=ParallelInfo(ecfg.tensor_parallel_size, ecfg.expert_parallel,
                              placement.as_dict() if placement is not None else None, split_sizes(cfg)),
        quantization=QuantizationInfo(q.kind, q.bytes, q.summary()) if q is not None else None,
        cuda_graphs=list(graphs.sizes) if graphs is not None else None)


def model_shape(runner: ModelRunner, max_model_len: int) -> ModelShape:
    cfg, model = runner.cfg, runner.model
    return ModelShape(
        cfg.architecture, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
        cfg.vocab_size, cfg.num_experts, cfg.num_experts_per_tok, [i for i, m in enumerate(cfg.moe_layers) if m],
        list(cfg.sliding_windows), cfg.query_pre_attn_scalar, cfg.hidden_act,
        str(getattr(runner, "weight_dtype", runner.dtype)).replace("torch.", ""), str(runner.device), max_model_len,
        tensor_bytes(model) + blocked_bytes(model), blocked_bytes(model),
        asdict(cfg.mla) if cfg.mla is not None else None,
        asdict(cfg.deepseek_moe) if cfg.deepseek_moe is not None else None)


def tensor_bytes(module: torch.nn.Module) -> int:
    """Parameters and buffers in memory, a tensor shared by two modules (a tied LM head) once."""
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def split_sizes(cfg: ModelConfig) -> list[int]:
    """The tensor-parallel sizes (2 up to the KV heads; MLA: the query heads) the engine accepts."""
    ok = []
    for n in range(2, (cfg.num_heads if cfg.mla is not None else cfg.num_kv_heads) + 1):
        try:
            check_shardable(cfg, n, False)
            ok.append(n)
        except ValueError:
            pass
    return ok
