"""Every layer of a decode pass in one C call (cpu_layer.c's tt_decode_stack, engine/layers/fused.py's
stack): the same logits, bit for bit, as the layers' fused calls one by one, wherever every layer
takes both its halves in C, a `full` trace too (the call writes its captures: tests/engine/trace/
test_stack_captures.py); a layer whose MLP half is not fused keeps the layers one by one."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, forward
from engine.layers import fused
from engine.trace.capture import CaptureSpec, PassCapture


@pytest.fixture(autouse=True)
def kernels(cpu_kernels_switch):
    cpu_kernels_switch(True)  # skips without a compiler (fails where CI requires the kernels)


def _decode_logits(llm: LLM, prompts: list[list[int]], calls: list, spec: CaptureSpec | None = None):
    """Prefill every prompt but its last token, then one decode pass over those last tokens
    (`calls` emptied before it: what it holds after is the decode pass's)."""
    engine = llm.engine
    seqs = [forward.admit(engine, ids, f"s{i}") for i, ids in enumerate(prompts)]
    try:
        for seq in seqs:
            forward.run(engine, [seq], len(seq) - 1)
        batch = forward.prepare(engine, seqs)
        calls.clear()
        return engine.runner.run(batch, None, PassCapture.of([spec] * len(seqs)))
    finally:
        for seq in seqs:
            engine.block_manager.free_seq(seq)


# plain; a MoE whose every layer is fused (its MoE half in cpu_moe.c); Gemma 3's local/global RoPE tables
@pytest.mark.parametrize("arch", ["llama", "mixtral", "gemma3"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_call_equals_the_layers_one_by_one(checkpoint, monkeypatch, arch, dtype):
    llm = LLM(checkpoint(arch), device="cpu", dtype=dtype, block_size=4)
    prompts = [list(range(3, 3 + n)) for n in (5, 9, 14)]
    calls = []
    real = fused.stack_forward
    monkeypatch.setattr(fused, "stack_forward", lambda *a: calls.append(1) or real(*a))
    one_call = _decode_logits(llm, prompts, calls)
    assert calls, "the pass did not take the one-call stack"
    monkeypatch.setattr(fused, "stack", lambda *a: None)
    by_layer = _decode_logits(llm, prompts, calls)
    assert not calls
    assert torch.equal(one_call, by_layer)


def test_a_full_trace_takes_it_and_an_unfused_mlp_half_keeps_the_layers_one_by_one(checkpoint, monkeypatch):
    llm = LLM(checkpoint("llama"), device="cpu", dtype="float32", block_size=4)
    calls = []
    real = fused.stack_forward
    monkeypatch.setattr(fused, "stack_forward", lambda *a: calls.append(1) or real(*a))
    spec = CaptureSpec(attention_layers=[0], heads=None, max_keys=8, moe=False, embed_dims=0)
    _decode_logits(llm, [[3, 4, 5, 6]], calls, spec)
    assert calls  # its captures written by the one call
    _decode_logits(llm, [[3, 4, 5, 6]], calls)
    assert calls
    # a shared expert: its MoE half runs in PyTorch
    shared = LLM(checkpoint("qwen2_moe"), device="cpu", dtype="float32", block_size=4)
    _decode_logits(shared, [[3, 4, 5, 6]], calls)
    assert not calls


def test_a_position_past_the_rope_tables_is_refused_before_anything_runs(checkpoint):
    """The one call reads each token's RoPE rows from the model's whole tables by position: one
    outside them is an IndexError (as the per-layer path's lookup gives), no row written."""
    llm = LLM(checkpoint("llama"), device="cpu", dtype="float32", block_size=4)
    engine = llm.engine
    seq = forward.admit(engine, [3, 4, 5, 6])
    try:
        forward.run(engine, [seq], 3)
        batch = forward.prepare(engine, [seq])
        rows = engine.runner.model.model.rotary.cos.shape[0]
        batch.positions[0] = rows  # one past the last row
        kv = engine.runner.kv_cache.clone()
        with pytest.raises(IndexError, match="RoPE"):
            engine.runner.run(batch)
        assert torch.equal(engine.runner.kv_cache, kv)
    finally:
        engine.block_manager.free_seq(seq)
