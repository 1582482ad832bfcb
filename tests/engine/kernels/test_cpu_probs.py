"""cpu_probs.c: a trace's attention probabilities read from the paged pool in place equal
the gathered-copy path (engine/trace/capture.py attention_probs + keep_keys): GQA, several
rows (a prefill chunk's causal mask), sliding windows, a subset of the pool's layers, the
first keys kept apart from the recent ones, queries as a view of a wider pass."""
from __future__ import annotations

import pytest
import torch

from engine.kernels import cpu_probs
from engine.trace.capture import attention_probs, keep_keys, key_window


@pytest.fixture
def kernels(cpu_kernels_switch):
    cpu_kernels_switch(True)


def pool_and_table(layers: int, blocks: int, bs: int, kvh: int, d: int, ctx: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    pool = torch.randn(2, layers, blocks, bs, kvh, d, generator=g)  # [K/V, layer, block, slot, KVH, D]
    table = torch.randperm(blocks, generator=g)[: -(-ctx // bs) + 2]  # its blocks anywhere, and spare ids
    return pool, table


@pytest.mark.parametrize("rows,ctx,max_keys,first,windows", [
    (1, 37, 64, 4, [None, None, None]),  # a decode row, every key kept
    (1, 37, 12, 4, [None, 8, None]),  # the first keys and the recent ones, a windowed layer
    (5, 23, 9, 0, [None, 3, 30]),  # a chunk's rows: causal, one run of recent keys
    (3, 16, 16, 4, [2, None, None]),
])
def test_the_kernel_equals_the_gathered_copy(kernels, rows, ctx, max_keys, first, windows):
    L, H, kvh, D, bs, T = 3, 8, 2, 32, 4, rows + 2
    pool, table = pool_and_table(4, 20, bs, kvh, D, ctx, seed=ctx + rows)
    layers = [0, 2, 3]  # a subset of the pool's 4 layers
    q_pass = torch.randn(L, T, H, D, generator=torch.Generator().manual_seed(1))
    q = q_pass[:, T - rows:]  # the sequence's rows: a view of the pass's queries
    k_head, k_start = key_window(ctx, max_keys, first)
    assert cpu_probs.applies(q, pool[0])
    got = cpu_probs.attention_probs_paged(q, pool[0], layers, table, ctx, 0.17, windows, k_head, k_start)
    k = pool[0][layers][:, table[: -(-ctx // bs)]].flatten(1, 2)  # the copy the torch path gathers
    want = keep_keys(attention_probs(q, k, ctx, 0.17, windows), k_head, k_start)
    assert got.shape == want.shape == (L, H, rows, k_head + ctx - k_start)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_it_refuses_what_it_does_not_read(kernels):
    pool, _ = pool_and_table(2, 4, 4, 2, 32, 8, seed=0)
    q = torch.randn(2, 1, 8, 32)
    assert cpu_probs.applies(q, pool[0]) and not cpu_probs.applies(q.bfloat16(), pool[0])
    assert not cpu_probs.applies(q, pool[0].bfloat16())
    assert not cpu_probs.applies(q.transpose(2, 3).contiguous().transpose(2, 3), pool[0])  # heads not contiguous


def test_without_the_c_kernels_it_does_not_apply(cpu_kernels_switch):
    cpu_kernels_switch(False)
    pool, _ = pool_and_table(2, 4, 4, 2, 32, 8, seed=0)
    assert not cpu_probs.applies(torch.randn(2, 1, 8, 32), pool[0])
