"""The engine's CPU decode attention against an independent dense oracle over unpaged K/V,
for lone and batched sequences, GQA groups and sliding windows, on both of its paths: the
C kernel reading the paged pool in place (engine/kernels/cpu_attention.c) and PyTorch's
(engine/layers/attention.py: query heads folded onto their KV head, the padded-key mask
built once per pass as an additive bias)."""
from __future__ import annotations

import pytest
import torch

from engine.batch import DecodeGroup
from engine.kernels import cpu as cpu_kernels
from engine.layers.attention import decode_attention
from tests.kernel_utils import make_paged_batch, naive_dense_attention


@pytest.fixture(autouse=True, params=["c", "torch"])
def path(request, monkeypatch, cpu_kernels_switch):
    if request.param == "c":
        cpu_kernels_switch(True)  # skips without a compiler (fails where CI requires the kernels)
    else:
        monkeypatch.setattr(cpu_kernels, "attention_applies", lambda *a: False)
    return request.param


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


@pytest.mark.parametrize("hd,group", [(64, 3), (24, 9), (128, 1)])
@pytest.mark.parametrize("window", [None, 200])
def test_long_contexts_over_several_chunks(hd, group, window):
    """Contexts longer than the C kernel's chunk of 128 keys (its running max and sum carry
    across chunks), head sizes that are not a multiple of 16, a window inside the context."""
    lens = [300, 129, 1, 128]
    q, kc, vc, bt, ctx, dk, dv = make_paged_batch(lens, 2, group, hd, 16, seed=hd, table_pad=0)
    kc, vc = (torch.nan_to_num(c, nan=30.0) for c in (kc, vc))
    q = q * 4  # sharper distributions: the softmax's max matters
    groups = DecodeGroup(list(range(len(lens))), None, bt.long(), ctx, lens)
    torch.testing.assert_close(decode_attention(q, kc, vc, bt.long(), ctx, hd ** -0.5, window, groups),
                               naive_dense_attention(q, dk, dv, hd ** -0.5, window), atol=2e-5, rtol=2e-5)


def test_a_sequence_with_no_keys_gets_zeros(path):
    if path == "torch":
        pytest.skip("the torch path never sees one; the C kernel may (padding rows)")
    q, kc, vc, bt, ctx, dk, dv = make_paged_batch([4, 6], 1, 2, 16, 8, table_pad=0)
    out = cpu_kernels.decode_attention(q, kc.nan_to_num(), vc.nan_to_num(), bt.long(), torch.tensor([4, 0]),
                                       0.25, None)
    assert out[1].abs().sum() == 0 and out[0].abs().sum() > 0
