"""Multi-head latent attention (DeepSeek V2/V3) over a paged pool of latents.

Each token stores one row of kv_lora_rank + qk_rope_head_dim numbers per layer: the
normalised latent c (kv_a_layernorm of kv_a_proj_with_mqa's first part) and the RoPE'd key
k_pe that every head shares. Per head h, kv_b_proj rebuilds from c the key part
k_nope_h = W_UK[h] c and the value v_h = W_UV[h] c. Two ways to attend:

- rebuild (prefill chunks): K and V for every head from the chunk's context, then ordinary
  attention with q = [q_nope, q_pe], k = [k_nope, k_pe].
- absorbed (decode): q_nope . (W_UK[h] c) = (W_UK[h]^T q_nope) . c, so the query is moved
  into latent space once and scores are read against the latent rows as they lie in the
  pool: multi-query attention with one "KV head" of latent_dim numbers, values = c; the
  output is lifted back by W_UV[h]. Nothing per head is rebuilt for the context. The paged
  decode kernels of other models run it as it is (latent_decode: Triton, the C kernel).

A trace captures the absorbed query of every row, so PassCapture's attention scores it
against the pool as for a one-KV-head model, with this layer's scale: the same probabilities.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.batch import ForwardBatch
from engine.config import ModelConfig
from engine.kernels import cpu as cpu_kernels
from engine.kernels import paged_decode_attention
from engine.layers.linear import Linear
from engine.layers.norm import RMSNorm
from engine.layers.rotary import rotate
from engine.trace.capture import PassCapture

LORA_NORM_EPS = 1e-6  # transformers builds q_a_layernorm / kv_a_layernorm with the default eps


class MLAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        m = cfg.mla
        self.layer_idx = layer_idx
        self.num_heads = cfg.num_heads
        self.num_kv_heads, self.head_dim = 1, m.latent_dim  # as the pool and a trace see it
        self.window = None
        self.nope, self.rope_dim, self.v_dim, self.rank = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, \
            m.kv_lora_rank
        self.interleaved = m.rope_interleave
        self.scale = m.scale
        H, qk = cfg.num_heads, m.qk_head_dim
        bias = cfg.qkv_bias
        if m.q_lora_rank is None:
            self.q_proj = Linear(cfg.hidden_size, H * qk, bias=False)
        else:
            self.q_a_proj = Linear(cfg.hidden_size, m.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, LORA_NORM_EPS)
            self.q_b_proj = Linear(m.q_lora_rank, H * qk, bias=False)
        self.kv_a_proj_with_mqa = Linear(cfg.hidden_size, m.latent_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, LORA_NORM_EPS)
        self.kv_b_proj = Linear(m.kv_lora_rank, H * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        self.o_proj = Linear(H * m.v_head_dim, cfg.hidden_size, bias=cfg.o_bias)
        # the pool's view for this layer: [blocks, slots, 1, latent_dim] (set by the model runner)
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)  # the same tensor: the latent is both key and value

    def _up(self) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_b_proj's weight per head: W_UK [H, nope, rank], W_UV [H, v, rank]."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.rank)
        return w[:, :self.nope], w[:, self.nope:]

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """RoPE on the last dim of x [T, n, rope_dim]. An interleaved checkpoint pairs dims
        (0, 1), (2, 3)...: taken apart into evens then odds, the rotate-half layout, which is
        what transformers' DeepSeek-V3 returns too (its cache keeps that layout)."""
        if self.interleaved:
            x = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
        return rotate(x, cos, sin)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, batch: ForwardBatch,
                capture: PassCapture | None = None) -> torch.Tensor:
        T, H = x.shape[0], self.num_heads
        q = self.q_proj(x) if hasattr(self, "q_proj") else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(T, H, self.nope + self.rope_dim)
        q_nope = q[..., :self.nope]
        kv = self.kv_a_proj_with_mqa(x)
        cos, sin = batch.rope["global"]
        q_pe = self._rope(q[..., self.nope:], cos, sin)
        latent = torch.cat([self.kv_a_layernorm(kv[:, :self.rank]),
                            self._rope(kv[:, None, self.rank:], cos, sin)[:, 0]], dim=-1)  # [T, latent]
        self.k_cache.view(-1, latent.shape[-1]).index_copy_(0, batch.slot_mapping, latent)
        w_uk, w_uv = self._up()
        q_lat = None
        if capture is not None and self.layer_idx in capture.attention_layers or batch.decode_group is not None:
            q_lat = torch.cat([absorb_query(q_nope, w_uk), q_pe], dim=-1)  # [T, H, latent]
            if capture is not None and self.layer_idx in capture.attention_layers:
                capture.layer_q[self.layer_idx] = q_lat  # scored against the pool after the pass
        out = x.new_empty(T, H, self.v_dim)
        group = batch.decode_group
        if group is not None:
            rows = slice(None) if group.rows is None else group.rows
            lat_out = latent_decode(q_lat[rows], self.k_cache, group, self.rank, self.scale, batch.use_triton)
            out[rows] = lift_values(lat_out, w_uv)
        for b in range(batch.num_seqs):
            sl = batch.seq_slice(b)
            if sl.stop - sl.start > 1:
                out[sl] = self._prefill(q_nope[sl], q_pe[sl], batch.block_tables[b], batch.context_lens[b])
        return self.o_proj(out.view(T, H * self.v_dim))

    def _prefill(self, q_nope: torch.Tensor, q_pe: torch.Tensor, block_table: torch.Tensor,
                 context_len: int) -> torch.Tensor:
        """n queries of one sequence (its last n positions): K and V of every head rebuilt
        from its context's latents. -> [n, H, v_head_dim]"""
        n, H = q_nope.shape[:2]
        bs = self.k_cache.shape[1]
        lat = self.k_cache.index_select(0, block_table[: -(-context_len // bs)]).flatten(0, 2)[:context_len]
        kv = self.kv_b_proj(lat[:, :self.rank]).view(context_len, H, self.nope + self.v_dim)
        k = torch.cat([kv[..., :self.nope], lat[:, None, self.rank:].expand(-1, H, -1)], dim=-1)
        q = torch.cat([q_nope, q_pe], dim=-1)
        pos = torch.arange(context_len, device=q.device)
        allowed = pos[None, :] <= pos[context_len - n:, None]
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                             kv[..., self.nope:].transpose(0, 1), allowed, scale=self.scale)
        return out.transpose(0, 1)


def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """q_nope [T, H, nope] -> its latent-space query [T, H, rank]: W_UK[h]^T q_nope[h]."""
    return torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)


def lift_values(lat_out: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """Attention output in latent space [B, H, rank] -> per-head values [B, H, v]: W_UV[h] o[h]."""
    return torch.bmm(lat_out.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)


def latent_decode(q_lat: torch.Tensor, cache: torch.Tensor, group, rank: int, scale: float,
                  use_triton: bool = False) -> torch.Tensor:
    """One absorbed query per sequence, q_lat [B, H, latent], against the latent rows of its
    context as the pool holds them (cache [blocks, slots, 1, latent]) -> [B, H, rank].
    The latent is one KV head that every query head reads (keys: whole rows, values: their
    first `rank` numbers), so the paged decode kernels of other models run it as they are,
    reading the pages in place: Triton (on CUDA, or the interpreter), the C kernel for float32
    on the CPU; each returns the rows' full width, of which the first `rank` are the values
    (the RoPE key's 64 of DeepSeek-V3's 576 are computed and dropped: 11% more than needed)."""
    if use_triton:
        return paged_decode_attention(q_lat, cache, cache, group.block_tables, group.context_lens, scale,
                                      use_triton=True)[..., :rank]
    if cpu_kernels.attention_applies(q_lat, cache):
        return cpu_kernels.decode_attention(q_lat, cache, cache, group.block_tables, group.context_lens, scale,
                                            None)[..., :rank]
    return latent_decode_reference(q_lat, cache, group, rank, scale)


def latent_decode_reference(q_lat: torch.Tensor, cache: torch.Tensor, group, rank: int,
                            scale: float) -> torch.Tensor:
    """latent_decode in plain torch: the context's latent rows gathered, padded to the
    longest context, one multi-query SDPA. -> [B, H, rank]"""
    B, H, D = q_lat.shape
    lat = cache.index_select(0, group.block_tables.flatten()).view(B, -1, D)  # [B, S, latent]
    allowed = group.key_mask(None, lat.shape[1], q_lat.dtype)
    if allowed is None:  # one sequence: its keys cut to its context
        lat = lat[:, :group.lens[0]]
    out = F.scaled_dot_product_attention(q_lat[:, None], lat[:, None], lat[:, None, :, :rank],
                                         None if allowed is None else allowed[:, None, None, :], scale=scale)
    return out[:, 0]
