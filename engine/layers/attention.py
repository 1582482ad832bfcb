"""Grouped-query attention over the paged KV cache.

Every pass first writes the new tokens' K/V into their cache slots, then each
query attends to its sequence's keys read back through the block table. So a
chunked prefill, a decode step and a prefix-cache hit are the same code path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.batch import DecodeGroup, ForwardBatch, key_mask
from engine.config import ModelConfig
from engine.kernels import cpu as cpu_kernels
from engine.kernels import paged_decode_attention
from engine.kernels import store_kv as store_kv_kernel
from engine.layers.linear import Linear
from engine.layers.norm import RMSNorm
from engine.layers.rotary import apply_rotary, rotate
from engine.trace.capture import PassCapture


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.attention_scale
        self.window = cfg.sliding_windows[layer_idx]  # None: a global layer; else it sees its last `window` keys
        # which RoPE table: Gemma 3's local (sliding-window) layers have one of their own
        self.rope = "local" if self.window is not None and cfg.local_rope_theta is not None else "global"
        self.clip_qkv = cfg.clip_qkv
        self.qk_norm = cfg.qk_norm
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm == "head":
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, cfg.norm_offset)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, cfg.norm_offset)
        elif cfg.qk_norm == "full":
            self.q_norm = RMSNorm(self.q_size, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.kv_size, cfg.rms_norm_eps)
        # Views into the engine's preallocated pool, set by the model runner.
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, batch: ForwardBatch,
                capture: PassCapture | None = None) -> torch.Tensor:
        T = x.shape[0]
        qkv = self.qkv_proj(x)
        cos, sin = batch.rope[self.rope]
        if self.qk_norm == "none" and self.clip_qkv is None:
            # q and k lie side by side in qkv: one RoPE pass over both
            qk = rotate(qkv[:, :self.q_size + self.kv_size].view(T, -1, self.head_dim), cos, sin)
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
            v = qkv[:, self.q_size + self.kv_size:].view(T, self.num_kv_heads, self.head_dim)
        else:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            if self.qk_norm == "full":
                q, k = self.q_norm(q), self.k_norm(k)
            if self.clip_qkv is not None:
                q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
            q = q.reshape(T, self.num_heads, self.head_dim)
            k = k.reshape(T, self.num_kv_heads, self.head_dim)
            v = v.reshape(T, self.num_kv_heads, self.head_dim)
            if self.qk_norm == "head":
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = apply_rotary(q, k, cos, sin)
        store_kv(k, v, self.k_cache, self.v_cache, batch)
        o = self.attend(q, batch, capture)
        return self.o_proj(o.reshape(T, self.q_size))

    def attend(self, q: torch.Tensor, batch: ForwardBatch, capture: PassCapture | None = None) -> torch.Tensor:
        if capture is not None and self.layer_idx in capture.attention_layers:
            # a full trace: its probabilities are computed after the pass (PassCapture),
            # so the output below takes the same fused path as when nobody watches
            capture.layer_q[self.layer_idx] = q
        if batch.use_triton and batch.decode_only:
            return paged_decode_attention(q, self.k_cache, self.v_cache, batch.block_tables,
                                          batch.context_lens_t, self.scale, self.window, use_triton=True)
        group = batch.decode_group
        if group is not None and group.rows is None:  # every sequence decodes one token
            return decode_attention(q, self.k_cache, self.v_cache, group.block_tables, group.context_lens,
                                    self.scale, self.window, group)
        out = torch.empty_like(q)
        if group is not None:
            out[group.rows] = decode_attention(q[group.rows], self.k_cache, self.v_cache, group.block_tables,
                                               group.context_lens, self.scale, self.window, group)
        for b in range(batch.num_seqs):
            sl = batch.seq_slice(b)
            if sl.stop - sl.start == 1:
                continue
            out[sl] = prefill_attention(q[sl], self.k_cache, self.v_cache, batch.block_tables[b],
                                        batch.context_lens[b], self.scale, self.window)
        return out


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             batch: ForwardBatch) -> None:
    if batch.use_triton:
        store_kv_kernel(k, v, k_cache, v_cache, batch.slot_mapping, use_triton=True)
        return
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, batch.slot_mapping, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, batch.slot_mapping, v)


def _window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    allowed = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        allowed &= k_pos[None, :] > q_pos[:, None] - window
    return allowed


def decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, window,
                     group: DecodeGroup | None = None):
    """One query per sequence, sequences batched and padded to the longest context.
    q: [B, H, D] -> out [B, H, D]. group: the pass's decode group, which builds the key
    mask once for all layers (a lone sequence needs none: its keys are cut to its context)."""
    if cpu_kernels.attention_applies(q, k_cache):  # the C kernel: keys read in place, no gather
        return cpu_kernels.decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, window)
    B, H, D = q.shape
    KVH = k_cache.shape[2]
    # index_select, not k_cache[block_tables]: advanced indexing runs a general (and on the
    # CPU, threaded) gather that costs ~100x more for these few small blocks
    blocks = block_tables.flatten()
    k = k_cache.index_select(0, blocks).view(B, -1, KVH, D)  # [B, S, KVH, D]
    v = v_cache.index_select(0, blocks).view(B, -1, KVH, D)
    if group is None:
        allowed = key_mask(context_lens, k.shape[1], window)
    elif (allowed := group.key_mask(window, k.shape[1], q.dtype)) is None:
        k, v = k[:, :group.lens[0]], v[:, :group.lens[0]]
    # The query heads that share a KV head become that head's query rows ([B, KVH, H/KVH, D]):
    # they see the same keys under the same mask, so one SDPA call over KVH heads of a few
    # rows does what enable_gqa does over H heads of one row, with less work per head
    # (CPU: 15-40% less per call)
    out = F.scaled_dot_product_attention(q.reshape(B, KVH, H // KVH, D), k.transpose(1, 2), v.transpose(1, 2),
                                         None if allowed is None else allowed[:, None, None, :], scale=scale)
    return out.reshape(B, H, D)


def prefill_attention(q, k_cache, v_cache, block_table, context_len, scale, window):
    """n queries of one sequence (the last n positions of its context).
    q: [n, H, D] -> out [n, H, D]."""
    n = q.shape[0]
    bs = k_cache.shape[1]
    blocks = block_table[: (context_len + bs - 1) // bs]
    k = k_cache.index_select(0, blocks).flatten(0, 1)[:context_len]  # [ctx, KVH, D]
    v = v_cache.index_select(0, blocks).flatten(0, 1)[:context_len]
    # 4-D inputs: on the CPU, SDPA takes its tiled flash kernel only for [B, H, n, D] (3-D
    # runs the math path, which materialises every score: 2,048 tokens of SmolLM2 6.5x slower)
    q4, k4, v4 = (t.transpose(0, 1)[None] for t in (q, k, v))
    if n == context_len and window is None:  # a fresh prompt: plain causal, no mask to build
        out = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale, enable_gqa=True)
    else:  # after cached or earlier-chunk keys (is_causal would align the diagonal top-left), or a window
        pos = torch.arange(context_len, device=q.device)
        allowed = _window_mask(pos[context_len - n:], pos, window)
        out = F.scaled_dot_product_attention(q4, k4, v4, allowed[None, None], scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)
