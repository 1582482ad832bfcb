"""The engine's CPU decode attention (engine/layers/attention.py: query heads folded onto
their KV head, the padded-key mask built once per pass as an additive bias) against an
independent dense oracle over unpaged K/V, for lone and batched sequences, GQA groups and
sliding windows."""
from __future__ import annotations

import pytest
import torch

from engine.batch import DecodeGroup
from engine.layers.attention import decode_attention
from tests.test_kernels import make_paged_batch, naive_dense_attention


@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("lens", [[21], [1, 8, 16, 19]])
def test_decode_attention_matches_dense(group, window, lens):
    bs, hd = 8, 16
    q, kc, vc, bt, ctx, dk, dv = make_paged_batch(lens, 2, group, hd, bs, seed=group, table_pad=0)
    # slots past a context hold stale keys in the engine's pool, not NaN: finite garbage
    # that must be masked out (large, so a leak would show)
    kc, vc = (torch.nan_to_num(c, nan=30.0) for c in (kc, vc))
    scale = hd ** -0.5
    dense = naive_dense_attention(q, dk, dv, scale, window)
    groups = DecodeGroup(list(range(len(lens))), None, bt.long(), ctx, lens)
    for _ in range(2):  # the second call per pass reuses the group's cached mask
        out = decode_attention(q, kc, vc, bt.long(), ctx, scale, window, groups)
        torch.testing.assert_close(out, dense, atol=1e-5, rtol=1e-5)
    # without a group (a caller outside a pass): the bool mask path
    torch.testing.assert_close(decode_attention(q, kc, vc, bt.long(), ctx, scale, window), dense,
                               atol=1e-5, rtol=1e-5)


def test_strided_queries_from_the_fused_projection():
    """In the engine q is a view into the qkv rows (not contiguous): the fold must read it right."""
    bs, hd, group = 8, 16, 3
    q, kc, vc, bt, ctx, dk, dv = make_paged_batch([5, 12], 2, group, hd, bs, table_pad=0)
    kc, vc = (torch.nan_to_num(c, nan=30.0) for c in (kc, vc))
    wide = torch.cat([q, torch.randn(2, 4, hd)], dim=1)  # q's heads, then k and v heads, as in qkv
    strided = wide[:, :q.shape[1]]
    assert not strided.is_contiguous()
    groups = DecodeGroup([0, 1], None, bt.long(), ctx, [5, 12])
    torch.testing.assert_close(decode_attention(strided, kc, vc, bt.long(), ctx, hd ** -0.5, None, groups),
                               naive_dense_attention(q, dk, dv, hd ** -0.5), atol=1e-5, rtol=1e-5)
