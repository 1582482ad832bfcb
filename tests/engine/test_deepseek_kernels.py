"""MLA's absorbed decode through the paged decode kernels: the latent is one KV head every
query head reads, so the Triton kernel (here under TRITON_INTERPRET=1) and the C kernel
(float32 on the CPU) run it in place over the pages; both equal the plain-torch reference,
and a whole model decoding through Triton keeps transformers' greedy tokens."""
from __future__ import annotations

import os

if os.environ.get("TOKENTRACE_TEST_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

import importlib.util  # noqa: E402

import pytest
import torch

from engine import LLM, SamplingParams
from engine.batch import DecodeGroup
from engine.forward import prompt_logits
from engine.kernels import cpu as cpu_kernels
from engine.layers.mla import latent_decode, latent_decode_reference
from tests.deepseek_tiny import make_deepseek
from tests.engine_utils import DEVICE
from tests.kernel_utils import make_paged_batch
from tests.tiny import load_reference

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def latent_batch(lens: list[int], heads: int, rank: int, rope: int, block_size: int = 4):
    """Shuffled pages of latent rows (NaN where no token is: a kernel reading past a context
    poisons its output), absorbed queries, and the decode group over them."""
    q, cache, _, tables, lens_t, dense, _ = make_paged_batch(lens, 1, heads, rank + rope, block_size, table_pad=0)
    group = DecodeGroup(list(range(len(lens))), None, tables, lens_t, lens)
    return q, cache, group, dense


def dense_oracle(q, dense, rank, scale):
    """Softmax over each sequence's latent rows, values their first `rank` numbers."""
    out = []
    for b, lat in enumerate(dense):
        lat = lat[:, 0]  # [ctx, latent]
        p = torch.softmax(q[b] @ lat.T * scale, dim=-1)  # [H, ctx]
        out.append(p @ lat[:, :rank])
    return torch.stack(out)


@pytest.mark.parametrize("lens,heads", [([5, 13, 1], 4), ([9], 8), ([17, 3], 16)])
def test_reference_and_c_kernel_equal_the_dense_oracle(lens, heads):
    q, cache, group, dense = latent_batch(lens, heads, 16, 8)
    expected = dense_oracle(q, dense, 16, 0.3)
    # the reference gathers whole pages and masks the slots past a context: finite there in the pool
    # (stale rows), so it gets them finite; the kernels must never read them (NaN)
    torch.testing.assert_close(latent_decode_reference(q, cache.nan_to_num(7.0), group, 16, 0.3), expected,
                               atol=1e-5, rtol=1e-5)
    assert cpu_kernels.attention_applies(q, cache) == cpu_kernels.available()
    torch.testing.assert_close(latent_decode(q, cache, group, 16, 0.3), expected, atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.parametrize("lens,heads,rank,rope", [([5, 13, 1], 4, 16, 8), ([9, 2], 3, 24, 6), ([6], 2, 512, 64)])
def test_triton_kernel_equals_the_dense_oracle(lens, heads, rank, rope):
    """The kernel's padded head dim (DeepSeek-V3's 576 -> 1024) and odd head counts included."""
    q, cache, group, dense = latent_batch(lens, heads, rank, rope)
    out = latent_decode(q, cache, group, rank, 0.2, use_triton=True)
    torch.testing.assert_close(out, dense_oracle(q, dense, rank, 0.2), atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # a whole model through the Triton interpreter
@needs_triton
def test_a_model_decoding_through_triton_keeps_the_greedy_tokens(tmp_path):
    path = make_deepseek("v3_moe", tmp_path)
    prompt = torch.randint(4, 300, (9,), generator=torch.Generator().manual_seed(2)).tolist()
    llm = LLM(path, device=DEVICE, dtype="float32", block_size=4, use_triton=True)
    assert llm.engine.runner.use_triton
    with torch.no_grad():
        ref = load_reference(path)
        expected = ref(torch.tensor([prompt])).logits[0]
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(prompt):].tolist()
    torch.testing.assert_close(prompt_logits(llm.engine, prompt, 1), expected, atol=1e-4, rtol=1e-4)
    assert llm.generate(prompt, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0].token_ids == want


def test_cuda_graphs_are_refused_clearly(tmp_path):
    path = make_deepseek("v2_lite", tmp_path)
    with pytest.raises(ValueError, match="MLA model"):
        LLM(path, device=DEVICE, dtype="float32", cuda_graphs=True)
