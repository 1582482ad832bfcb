"""What a `full` trace records from one forward pass: what to record for each sequence
(CaptureSpec), what the pass kept and what became of it (PassCapture), gathered after
the pass (collect).

During the pass the layers only keep references in the PassCapture they are handed:
each captured attention layer its queries, each MoE layer its routing, the model its
embedding rows. So the pass runs the same fused kernels (SDPA, Triton) as an untraced
one. Afterwards, in a few batched ops:

- attention probabilities: where every layer runs in one C call on the CPU, that pass's
  attention writes them itself as it scores the keys (engine/trace/pass_probs.py); elsewhere
  they are recomputed for every captured layer at once from the
  kept queries and the keys already in the paged cache, for the captured heads and the
  last `max_keys` query rows only (softmax over all keys, then `max_keys` columns kept:
  the first `first_keys`, the attention sink and the prompt's start, and the most recent
  ones, see key_window), so a long prompt costs rows x context, not its whole square;
  on the CPU in one C call that reads the keys where the pool holds them (cpu_probs),
  elsewhere from a gathered copy of the sequence's keys;
- MoE routing stays the pass's tensors: it becomes Python lists, rounded like
  `trace.jsonable` (and the batch's expert load is counted), when its first event is
  built, mostly after the request's last token (MoeLists);
- attention (all of a sequence's captured layers in one tensor) and embedding rows stay
  tensors: the trace events encode them (engine/trace/compact.py), after the step knows which
  of the pass's rows it kept (none past an end of sequence inside a speculative round).

The captures are an object apart from the pass's inputs (ForwardBatch):
a pass nobody traces gets none (`capture=None`), and a CUDA graph's static batch never
carries one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from engine.batch import ForwardBatch
from engine.config import ModelConfig
from engine.kernels import cpu_probs
from engine.trace.costs import TraceCosts
from engine.trace.moe_lists import MoeLists
from engine.trace.tracer import FIRST_KEYS


def key_window(ctx: int, max_keys: int, first_keys: int = FIRST_KEYS) -> tuple[int, int]:
    """Which of a context's `ctx` keys a capture keeps -> (k_head, k_start): positions
    0 .. k_head - 1, then k_start .. ctx - 1 (k_head = 0, one run from k_start, where the
    context fits in max_keys or first_keys is 0). A first key costs about one and a half
    recent ones in a trace's bytes (the sink's large weights compress worse than the tail's
    near-zero ones: SmolLM2, 2026-12-04), so the recent run gives up half as many columns as
    there are first keys: 8 + 52 columns cost what 64 recent ones did. The gap
    k_head .. k_start - 1 is at least one key wide whenever k_head > 0."""
    if ctx <= max_keys:
        return 0, 0
    head = max(0, min(first_keys, max_keys // 2))
    return head, ctx - max(1, max_keys - head - head // 2)


def keep_keys(probs: torch.Tensor, k_head: int, k_start: int) -> torch.Tensor:
    """[..., ctx] probabilities -> the kept columns: 0 .. k_head - 1, then k_start on."""
    if not k_head:
        return probs[..., k_start:]
    return torch.cat([probs[..., :k_head], probs[..., k_start:]], dim=-1)


@dataclass
class CaptureSpec:
    """What to record for one sequence during a forward pass (bounded on purpose:
    a long prompt must not turn the trace into gigabytes)."""
    attention_layers: list[int]  # empty: no attention capture
    heads: list[int] | None  # None: all query heads
    max_keys: int  # keep at most the last `max_keys` query rows and `max_keys` key columns
    moe: bool
    embed_dims: int  # 0: no embedding rows
    logit_lens: int = 0  # candidates per layer in the logit lens; 0: no lens
    compact: bool = True  # attention and embedding rows in engine/trace/compact.py's form (else lists)
    first_keys: int = FIRST_KEYS  # of the max_keys columns, the first positions kept (key_window)


@dataclass(slots=True)
class PassCapture:
    """One pass's captures: written by the model during the pass (references only), filled
    after it by collect(), read by the engine's trace events."""
    specs: list[CaptureSpec | None]  # per sequence of the batch
    # Logit lens (engine/trace/logit_lens.py): the flat rows whose residual stream is kept after the
    # embedding and after every layer but the last (set by the engine: the sampled rows of
    # lens-traced sequences), and where each of them is among the rows the pass returns logits for
    lens_rows: list[int] | None = None
    lens_out_rows: list[int] = field(default_factory=list)
    lens_later: bool = False  # the pass keeps the rows only; the lens is computed after the step
    # Kept during the pass:
    layer_q: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> queries [T, H, D]
    layer_q_all: torch.Tensor | None = None  # every layer's queries in one [L, T, H, D] (the one-call stack's)
    moe_routing: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # experts, weights
    # every layer's routing as one [L, T, top_k] tensor each, where one call wrote them (the stack's:
    # then no layer's apart in moe_routing, whose views were a cold torch op each a step)
    moe_all: tuple[torch.Tensor, torch.Tensor] | None = None
    # DeepSeek MoE: layer -> what the router's choice shows (engine/layers/deepseek_moe.py route), [T, ...] each
    moe_detail: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    # seq -> [n, embed_dims]; None until the captures are read where the one-call stack's decode keeps them
    embed_rows: dict[int, torch.Tensor | None] = field(default_factory=dict)
    lens_hidden: list[torch.Tensor] = field(default_factory=list)  # L tensors [len(lens_rows), hidden]
    # After the LM head: [L * len(lens_rows) + returned rows, vocab], and the rows it returned
    lens_logits: torch.Tensor | None = None
    lens_returned: int = 0
    # Filled after the pass by collect: per captured sequence, its attention in every captured layer
    # (AttentionCapture); the MoE routing (lists made when its events are built); its embedding rows
    attention: dict[int, "AttentionCapture"] = field(default_factory=dict)
    moe: MoeLists | None = None  # the routing's tensors (lists once its first event is built); None: no MoE
    embed: dict[int, torch.Tensor] = field(default_factory=dict)  # seq -> rows [n, embed_dims]
    collect_costs: TraceCosts = field(default_factory=TraceCosts)  # collect()'s time by kind
    # what the pass left for when its captures are first read (ready): the one-call stack's bookkeeping and
    # collect(), where neither reads the KV cache (run cold at every step, ~25 us of the embedded MoE's
    # step at batch 1; a step that is not live reads them after the request's last token, 2026-12-07)
    pending: list[Callable[[], None]] = field(default_factory=list)
    attention_layers: frozenset[int] = field(init=False)  # layers whose attention some sequence captures

    def __post_init__(self) -> None:
        self.attention_layers = frozenset().union(*(c.attention_layers for c in self.specs if c is not None))

    def ready(self) -> bool:
        """The pass's captures as the fields above say, whatever waited done; True where some did."""
        if not self.pending:
            return False
        work, self.pending = self.pending, []
        for w in work:
            w()
        return True

    @classmethod
    def of(cls, specs: list[CaptureSpec | None]) -> "PassCapture | None":
        """The pass's captures; None where no sequence records anything (most passes)."""
        return cls(specs) if any(c is not None for c in specs) else None


@dataclass
class AttentionCapture:
    """One sequence's attention in one pass, every captured layer at once."""
    layers: list[int]
    windows: list[int | None]  # each layer's sliding window (None: global)
    q_start: int  # the position of the first captured query row
    k_start: int  # ... and of the first captured key column after the first k_head
    probs: torch.Tensor  # float32 [layers, heads kept, rows, keys]: keys 0 .. k_head - 1, then k_start on
    k_head: int = 0  # key_window's: the first positions kept before the gap (0: one run from k_start)


def collect(capture: PassCapture, batch: ForwardBatch, cfg: ModelConfig, kv_cache: torch.Tensor) -> None:
    """Fill capture.attention / moe / embed, timing each kind (collect_costs).
    kv_cache: the runner's pool [K/V, layer, block, slot, kv head, dim]."""
    spent = capture.collect_costs
    t = time.perf_counter()
    for b, spec in enumerate(capture.specs):
        if spec is None:
            continue
        if b in capture.embed_rows:
            rows = capture.embed_rows[b]
            capture.embed[b] = rows if rows.dtype == torch.float32 else rows.float()
            t = spent.since("embedding rows", t)
        layers = [layer for layer in spec.attention_layers if layer in capture.layer_q]
        if layers and b not in capture.attention:  # (the pass's own attention may have written them: pass_probs)
            _attention(capture, batch, cfg, kv_cache, b, layers)
            t = spent.since("attention", t)
    if capture.moe_routing or capture.moe_all is not None:
        _moe(capture, batch, cfg)
        spent.since("moe routing", t)


def attention_probs(q: torch.Tensor, k: torch.Tensor, ctx: int, scale: float,
                    windows: list[int | None]) -> torch.Tensor:
    """q: [L, rows, H, D], the queries at the last `rows` positions of a context of `ctx`
    keys; k: [L, S, KVH, D], S >= ctx (keys past ctx, a block's unused slots, are
    ignored); query head h reads KV head h // (H // KVH). -> float32 probabilities
    [L, H, rows, ctx], causal and per-layer sliding-window masked (HF semantics)."""
    L, rows, H, D = q.shape
    S, kvh = k.shape[1], k.shape[2]
    if q.dtype != torch.float32:
        q, k = q.float(), k.float()
    # Each query row as a KVH*D vector, zero outside the slice of the KV head it reads: one
    # matmul against the keys as the cache lays them out (no copy of them) scores every head.
    qb = q.new_zeros(L, kvh, H // kvh, rows, kvh, D)
    qb.diagonal(0, 1, 4).copy_(q.reshape(L, rows, kvh, H // kvh, D).permute(0, 3, 1, 4, 2))
    scores = torch.bmm(qb.view(L, H * rows, kvh * D), k.reshape(L, S, kvh * D).transpose(1, 2))
    scores = scores.view(L, H, rows, S)[..., :ctx] * scale
    if rows > 1 or any(w is not None and w < ctx for w in windows):  # a lone last query sees every key
        k_pos = torch.arange(ctx, device=q.device)
        q_pos = k_pos[ctx - rows:, None]
        allowed = (k_pos[None, :] <= q_pos).expand(L, rows, ctx)
        if any(w is not None for w in windows):
            w = torch.tensor([w if w is not None else ctx + 1 for w in windows], device=q.device)
            allowed = allowed & (k_pos[None, None, :] > q_pos[None] - w[:, None, None])
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    return scores.softmax(-1)  # (F.softmax's own call, less its wrapper)


def _attention(capture: PassCapture, batch: ForwardBatch, cfg: ModelConfig, kv_cache: torch.Tensor, b: int,
               layers: list[int]) -> None:
    spec = capture.specs[b]
    end, ctx = batch.query_starts[b + 1], batch.context_lens[b]
    rows = min(end - batch.query_starts[b], spec.max_keys)
    k_head, k_start = key_window(ctx, spec.max_keys, spec.first_keys)
    whole = rows == batch.input_ids.shape[0]  # the batch is these rows (batch-1 decode): no slicing
    q_all = capture.layer_q_all
    if q_all is not None and layers == list(range(q_all.shape[0])):  # every layer, written as one tensor
        q = q_all if whole else q_all[:, end - rows:end]  # (a view: no copy of the rows)
    else:
        q = torch.stack([capture.layer_q[layer] if whole else capture.layer_q[layer][end - rows:end]
                         for layer in layers])  # [L, rows, H, D]
    windows = [cfg.sliding_windows[layer] for layer in layers]  # Gemma 3: local layers windowed, global not
    # the scale the layers use: 1/sqrt(head_dim), or Gemma's 1/sqrt(query_pre_attn_scalar)
    if cpu_probs.applies(q, kv_cache[0]):  # the keys read where the pool holds them, the kept columns written
        probs = cpu_probs.attention_probs_paged(q, kv_cache[0], layers, batch.block_tables[b], ctx,
                                                cfg.attention_scale, windows, k_head, k_start)
    else:
        # the sequence's keys in every layer: [layer, block, slot, KVH, D] -> its blocks
        k = kv_cache[0].index_select(1, batch.block_tables[b, : -(-ctx // kv_cache.shape[3])])
        if len(layers) < k.shape[0]:
            k = k.index_select(0, torch.tensor(layers, device=k.device))
        k = k.flatten(1, 2)  # [L, blocks x slots >= ctx, KVH, D]
        probs = keep_keys(attention_probs(q, k, ctx, cfg.attention_scale, windows), k_head, k_start)
    if spec.heads is not None:
        probs = probs[:, spec.heads]
    capture.attention[b] = AttentionCapture(layers, windows, ctx - rows, k_start, probs, k_head)


def _moe(capture: PassCapture, batch: ForwardBatch, cfg: ModelConfig) -> None:
    """The pass's routing as the pass wrote it; the lists (and each layer's expert load) are
    made when its first `moe` event is built (MoeLists)."""
    capture.moe = MoeLists(capture.moe_routing, capture.moe_all, capture.moe_detail, batch.query_starts,
                           cfg.num_experts)
