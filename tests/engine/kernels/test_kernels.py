"""Triton kernels vs their plain-torch references, run on CPU under the Triton interpreter
(with TOKENTRACE_TEST_DEVICE=cuda, natively on the GPU).

The references are themselves checked against a naive dense attention over unpaged K/V,
so a bug shared by kernel and reference cannot pass unnoticed.
"""

from __future__ import annotations

import os

DEVICE = os.environ.get("TOKENTRACE_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import engine.kernels as K
from engine.kernels import (
    paged_decode_attention,
    paged_decode_attention_reference,
    paged_decode_attention_triton,
    store_kv,
    store_kv_reference,
    store_kv_triton,
)

from tests.kernel_utils import make_paged_batch, naive_dense_attention  # noqa: E402
from tests.paths import ROOT  # noqa: E402

REPO = ROOT


def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


needs_triton = pytest.mark.skipif(not _triton_importable(), reason="triton is not importable")
cpu_only = pytest.mark.skipif(DEVICE != "cpu", reason="checks the CPU dispatch")


def on_device(*ts: torch.Tensor) -> list[torch.Tensor]:
    """Copies where the kernels under test run (the references stay on the CPU)."""
    return [t.to(DEVICE) for t in ts]

TOL = {  # (atol, rtol) for kernel vs reference
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def ragged_lens(block_size: int) -> list[int]:
    # 1 token, exactly one block, exactly two blocks, a partial last block.
    return [1, block_size, 2 * block_size, 2 * block_size + 3]


# ---------------------------------------------------------------- the oracles themselves


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("sliding_window", [None, 1, 5, 1000])
def test_reference_attention_matches_dense(group, sliding_window):
    bs, hd = 8, 16
    q, kc, vc, bt, lens, dk, dv = make_paged_batch(ragged_lens(bs), 2, group, hd, bs, seed=group)
    scale = hd**-0.5
    ref = paged_decode_attention_reference(q, kc, vc, bt, lens, scale, sliding_window)
    dense = naive_dense_attention(q, dk, dv, scale, sliding_window)
    assert torch.isfinite(ref).all()
    torch.testing.assert_close(ref, dense, atol=1e-5, rtol=1e-5)


def test_sliding_window_changes_the_answer():
    # Guards against a window test passing because the window had no effect.
    q, kc, vc, bt, lens, dk, dv = make_paged_batch([20], 1, 2, 16, 8)
    full = naive_dense_attention(q, dk, dv, 0.25)
    windowed = naive_dense_attention(q, dk, dv, 0.25, sliding_window=5)
    assert (full - windowed).abs().max() > 1e-3
    # window 1: the query sees only its own key, so the output is exactly that value row.
    only_self = paged_decode_attention_reference(q, kc, vc, bt, lens, 0.25, sliding_window=1)
    torch.testing.assert_close(only_self[0], dv[0][-1].repeat_interleave(2, dim=0))


def test_reference_store_writes_slots_and_skips_padding():
    n_blocks, bs, h, d = 4, 8, 2, 16
    kc = torch.zeros(n_blocks, bs, h, d)
    vc = torch.zeros(n_blocks, bs, h, d)
    key, value = torch.randn(5, h, d), torch.randn(5, h, d)
    slots = torch.tensor([3, -1, 17, 31, -1])
    store_kv_reference(key, value, kc, vc, slots)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(kc[s // bs, s % bs], key[i])
            assert torch.equal(vc[s // bs, s % bs], value[i])
    written = torch.zeros(n_blocks * bs, dtype=torch.bool)
    written[[3, 17, 31]] = True
    assert (kc.view(-1, h, d)[~written] == 0).all() and (vc.view(-1, h, d)[~written] == 0).all()


# ---------------------------------------------------------------- store_kv: Triton vs reference


def _store_case(n_tokens, h, d, bs, dtype, slot_dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    n_blocks = -(-n_tokens // bs) + 2
    slots = torch.randperm(n_blocks * bs, generator=g)[:n_tokens]
    slots[::3] = -1  # padding tokens
    key = torch.randn(n_tokens, h, d, generator=g).to(dtype)
    value = torch.randn(n_tokens, h, d, generator=g).to(dtype)
    kc = torch.randn(n_blocks, bs, h, d, generator=g).to(dtype)  # pre-existing contents must survive
    vc = torch.randn(n_blocks, bs, h, d, generator=g).to(dtype)
    return key, value, kc, vc, slots.to(slot_dtype)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("bs,h,d", [(8, 2, 16), (16, 4, 32), (16, 3, 24)])
def test_store_kv_triton_matches_reference(dtype, slot_dtype, bs, h, d):
    key, value, kc, vc, slots = _store_case(11, h, d, bs, dtype, slot_dtype)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    store_kv_reference(key, value, kc_ref, vc_ref, slots)
    assert not torch.equal(kc_ref, kc)  # the reference did write something
    key, value, kc, vc, slots = on_device(key, value, kc, vc, slots)
    store_kv_triton(key, value, kc, vc, slots)
    assert torch.equal(kc.cpu(), kc_ref) and torch.equal(vc.cpu(), vc_ref)  # a copy must be exact


@needs_triton
def test_store_kv_triton_strided_input_and_cache_view():
    # key/value split from a fused qkv (strided), cache a view into a larger [2, ...] buffer.
    n, h, d, bs = 6, 2, 16, 8
    qkv = torch.randn(n, (4 + 2 * h) * d, device=DEVICE)
    key = qkv[:, 4 * d : (4 + h) * d].view(n, h, d)
    value = qkv[:, (4 + h) * d :].view(n, h, d)
    kv = torch.zeros(2, 3, bs, h, d, device=DEVICE)
    slots = torch.tensor([0, 9, -1, 23, 8, 1], dtype=torch.int64, device=DEVICE)
    ref = kv.clone()
    store_kv_reference(key, value, ref[0], ref[1], slots)
    store_kv_triton(key, value, kv[0], kv[1], slots)
    assert torch.equal(kv, ref)


@needs_triton
@cpu_only
def test_store_kv_dispatch(monkeypatch):
    key, value, kc, vc, slots = _store_case(5, 2, 16, 8, torch.float32, torch.int64)
    calls = []
    import engine.kernels.kv_store as mod

    real = mod.store_kv_triton
    monkeypatch.setattr(mod, "store_kv_triton", lambda *a: (calls.append(1), real(*a)))
    store_kv(key, value, kc.clone(), vc.clone(), slots)  # CPU, no flag: reference
    assert calls == []
    store_kv(key, value, kc, vc, slots, use_triton=True)  # interpreter: Triton
    assert calls == [1]
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        store_kv(key, value, kc, vc, slots, use_triton=True)


# ---------------------------------------------------------------- paged attention: Triton vs reference


def _check_attention(q, kc, vc, bt, lens, scale, sliding_window, dtype):
    ref = paged_decode_attention_reference(q, kc, vc, bt, lens, scale, sliding_window)
    out = paged_decode_attention_triton(*on_device(q, kc, vc, bt, lens), scale, sliding_window).cpu()
    assert out.dtype == q.dtype and out.shape == q.shape
    assert torch.isfinite(out).all(), "kernel read a slot outside the context (NaN-poisoned)"
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


@needs_triton
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("head_dim", [16, 32, 64])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("sliding_window", [None, 6])
def test_paged_attention_triton_fp32(block_size, head_dim, group, sliding_window):
    seed = block_size + head_dim + group
    q, kc, vc, bt, lens, *_ = make_paged_batch(ragged_lens(block_size), 2, group, head_dim, block_size, seed=seed)
    _check_attention(q, kc, vc, bt, lens, head_dim**-0.5, sliding_window, torch.float32)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group,sliding_window", [(1, None), (4, 6), (2, 1)])
def test_paged_attention_triton_half(dtype, group, sliding_window):
    q, kc, vc, bt, lens, *_ = make_paged_batch(ragged_lens(16), 2, group, 32, 16, dtype=dtype, seed=7)
    _check_attention(q, kc, vc, bt, lens, 32**-0.5, sliding_window, dtype)


@needs_triton
@pytest.mark.parametrize("sliding_window", [1, 8, 9, 17, 1000, 2**40])
def test_paged_attention_triton_window_edges(sliding_window):
    # Windows at / around block boundaries, wider than the context, and beyond int32.
    q, kc, vc, bt, lens, *_ = make_paged_batch([1, 8, 9, 17, 30], 1, 2, 16, 8, seed=3, table_pad=0)
    _check_attention(q, kc, vc, bt, lens, 0.25, sliding_window, torch.float32)


@needs_triton
def test_paged_attention_triton_odd_head_dim_and_group():
    # head_dim 24 and group 3: not powers of two, padded and masked inside the kernel.
    q, kc, vc, bt, lens, *_ = make_paged_batch([5, 16, 21], 2, 3, 24, 8, seed=11)
    _check_attention(q, kc, vc, bt, lens, 24**-0.5, None, torch.float32)
    _check_attention(q, kc, vc, bt, lens, 24**-0.5, 7, torch.float32)


@needs_triton
def test_paged_attention_triton_int64_metadata_and_strided_q():
    # The engine may hand over int64 block tables / lengths and q sliced out of a fused qkv.
    q, kc, vc, bt, lens, *_ = make_paged_batch([4, 12, 17], 2, 2, 16, 8, seed=13)
    q_strided = torch.cat([q, torch.randn_like(q)], dim=-1)[..., :16]
    assert not q_strided.is_contiguous()
    _check_attention(q_strided, kc, vc, bt.long(), lens.long(), 0.25, 5, torch.float32)


@needs_triton
def test_paged_attention_triton_matches_dense_end_to_end():
    # store_kv_triton fills the cache, the kernel reads it; compared with dense attention directly.
    bs, h_kv, group, d = 8, 2, 2, 16
    lens = [3, 8, 13]
    g = torch.Generator().manual_seed(5)
    n_blocks = 8
    ids = torch.randperm(n_blocks, generator=g)
    bt = torch.full((len(lens), 3), -1, dtype=torch.int32)
    kc = torch.full((n_blocks, bs, h_kv, d), float("nan"))
    vc = kc.clone()
    dk, dv, slots, nxt = [], [], [], 0
    for b, ctx in enumerate(lens):
        nb = -(-ctx // bs)
        bt[b, :nb] = ids[nxt : nxt + nb].int()
        nxt += nb
        slots += [int(bt[b, t // bs]) * bs + t % bs for t in range(ctx)] + [-1]  # + a padding token
        dk.append(torch.randn(ctx, h_kv, d, generator=g))
        dv.append(torch.randn(ctx, h_kv, d, generator=g))
    pad = torch.zeros(1, h_kv, d)
    key = torch.cat([t for k in dk for t in (k, pad)])
    value = torch.cat([t for v in dv for t in (v, pad)])
    kc, vc, key, value, slots, bt = on_device(kc, vc, key, value, torch.tensor(slots), bt)
    store_kv_triton(key, value, kc, vc, slots)
    q = torch.randn(len(lens), h_kv * group, d, generator=g)
    for window in (None, 4):
        out = paged_decode_attention(*on_device(q, kc, vc, bt, torch.tensor(lens, dtype=torch.int32)), d**-0.5,
                                     window, use_triton=True).cpu()
        torch.testing.assert_close(out, naive_dense_attention(q, dk, dv, d**-0.5, window), atol=1e-5, rtol=1e-5)


@needs_triton
@cpu_only
def test_paged_attention_dispatch(monkeypatch):
    q, kc, vc, bt, lens, *_ = make_paged_batch([3, 9], 1, 2, 16, 8)
    import engine.kernels.paged_attention as mod

    calls = []
    real = mod.paged_decode_attention_triton
    monkeypatch.setattr(mod, "paged_decode_attention_triton", lambda *a: (calls.append(1), real(*a))[1])
    ref = paged_decode_attention(q, kc, vc, bt, lens, 0.25)
    assert calls == []
    out = paged_decode_attention(q, kc, vc, bt, lens, 0.25, use_triton=True)
    assert calls == [1]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    out = paged_decode_attention(q, kc, vc, bt, lens, 0.25, use_triton=False)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


# ---------------------------------------------------------------- import contract


def test_import_does_not_import_triton():
    # Load engine/kernels as a standalone package so this checks only our files.
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('kernels_under_test', {str(REPO / 'engine/kernels/__init__.py')!r},"
        f" submodule_search_locations=[{str(REPO / 'engine/kernels')!r}])\n"
        "m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m)\n"
        "assert 'triton' not in sys.modules, 'importing engine.kernels imported triton'\n"
        "assert isinstance(m.triton_available(), bool)\n"
        "assert 'triton' not in sys.modules, 'triton_available() imported triton'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_public_api():
    assert set(K.__all__) >= {"store_kv", "paged_decode_attention", "triton_available"}
    assert K.triton_available() == (importlib.util.find_spec("triton") is not None)
