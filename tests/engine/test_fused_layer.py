"""The fused CPU decode layer (engine/layers/fused.py, engine/kernels/cpu_layer.c) against
the layer's own modules: the same logits for a decode batch of sequences at different
lengths (past a sliding window, with q/k/v biases, MoE layers whose attention half alone
is fused), the same attention and routing in a `full` trace, and the modules kept
wherever the fused calls do not apply.
(tests/engine/test_parity.py holds both paths against transformers' logits and greedy tokens.)"""
from __future__ import annotations

import pytest
import torch

from engine import LLM, forward
from engine.kernels import cpu as cpu_kernels
from engine.layers import fused
from engine.sampling_params import SamplingParams
from engine.trace.capture import CaptureSpec, PassCapture


@pytest.fixture(autouse=True)
def kernels(cpu_kernels_switch):
    cpu_kernels_switch(True)  # skips without a compiler (fails where CI requires the kernels)


def _decode_pass(llm: LLM, prompts: list[list[int]], capture: CaptureSpec | None = None):
    """Prefill every prompt but its last token, then one decode pass over those last tokens,
    twice: fused, then through the modules (the same K/V rewritten to the same slots).
    -> (logits, captured attention, captured MoE routing) of each."""
    engine = llm.engine
    seqs = [forward.admit(engine, ids, f"s{i}") for i, ids in enumerate(prompts)]
    for seq in seqs:
        forward.run(engine, [seq], len(seq) - 1)
    layers = engine.runner.model.model.layers
    results = []
    try:
        for fuse in (True, False):
            for layer in layers:
                layer.fusable = fuse and layer.fusable
            batch = forward.prepare(engine, seqs)
            assert batch.decode_group is not None and batch.decode_group.rows is None
            results.append(_run(engine, batch, [capture] * len(seqs)))
            if fuse:
                assert all(layer.fused is not None for layer in layers)
    finally:
        for seq in seqs:
            engine.block_manager.free_seq(seq)
    return results


def _run(engine, batch, specs: list[CaptureSpec | None]):
    """The pass -> (logits, captured attention, captured MoE routing)."""
    capture = PassCapture.of(specs)
    logits = engine.runner.run(batch, None, capture)
    return (logits, {}, {}) if capture is None else \
        (logits, capture.attention, moe_lists(capture))


def moe_lists(capture: PassCapture) -> dict:
    """layer -> sequence -> its routing as the `moe` event's lists, of the sequences that record it."""
    if capture.moe is None:
        return {}
    seqs = [b for b, spec in enumerate(capture.specs) if spec is not None and spec.moe]
    return {layer: {b: capture.moe.seq(layer, b) for b in seqs} for layer in capture.moe.layers} if seqs else {}


# plain; a sliding window; biases and a window; MoE (the attention half fused); MoE and dense layers;
# per-head q/k norms; those, sandwich norms, GeGLU and local/global layers; q/k norms before a MoE
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3", "gemma3",
                                  "qwen3_moe"])
def test_fused_decode_equals_the_modules(checkpoint, arch):
    llm = LLM(checkpoint(arch), device="cpu", dtype="float32", block_size=4)
    layers = llm.engine.runner.model.model.layers
    assert all(layer.fusable for layer in layers)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(4, 300, (n,), generator=g).tolist() for n in (3, 13, 22, 9)]
    (fused_logits, *_), (module_logits, *_) = _decode_pass(llm, prompts)
    assert fused_logits.shape == (4, llm.engine.model_config.vocab_size)
    torch.testing.assert_close(fused_logits, module_logits, atol=2e-5, rtol=1e-5)
    # the MLP half fused for dense layers, and a plain MoE block's (no shared expert) as one C call
    # (cpu_moe.c); Qwen2-MoE's, with its shared expert, runs its own modules
    moe = llm.engine.model_config.moe_layers
    assert [layer.fused.mlp for layer in layers] == [not m or arch != "qwen2_moe" for m in moe]
    assert [layer.fused.moe is not None for layer in layers] == [m and arch != "qwen2_moe" for m in moe]


@pytest.mark.parametrize("arch", ["llama", "mixtral"])
def test_a_full_trace_reads_the_fused_queries_and_routing(checkpoint, arch):
    llm = LLM(checkpoint(arch), device="cpu", dtype="float32", block_size=4)
    spec = CaptureSpec(attention_layers=[0, 1], heads=None, max_keys=64, moe=arch == "mixtral", embed_dims=0)
    prompts = [list(range(5, 16)), list(range(40, 46))]
    (_, fused_attn, fused_moe), (_, module_attn, module_moe) = _decode_pass(llm, prompts, spec)
    assert set(fused_attn) == {0, 1} and fused_attn.keys() == module_attn.keys()  # both sequences
    for b in fused_attn:
        got, want = fused_attn[b], module_attn[b]
        assert got.layers == want.layers == [0, 1] and (got.q_start, got.k_start) == (want.q_start, want.k_start)
        torch.testing.assert_close(got.probs, want.probs, atol=2e-4, rtol=0)
    assert bool(fused_moe) == (arch == "mixtral") and fused_moe.keys() == module_moe.keys()
    for layer in fused_moe:
        for b in fused_moe[layer]:
            assert fused_moe[layer][b]["experts"] == module_moe[layer][b]["experts"]


# whole-projection q/k norms and clipping
@pytest.mark.parametrize("arch", ["olmoe"])
def test_layers_of_other_kinds_keep_their_modules(checkpoint, arch):
    llm = LLM(checkpoint(arch), device="cpu", dtype="float32", block_size=4)
    layers = llm.engine.runner.model.model.layers
    assert not any(layer.fusable for layer in layers)
    llm.generate([list(range(5, 12))] * 2, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert all(layer.fused is None for layer in layers)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantized_layers_fuse_with_their_own_kernels(checkpoint, kind):
    """int8 / int4 projections (cpu_quant.c, a library of its own) inside the fused calls:
    the same logits as the quantized modules."""
    llm = LLM(checkpoint("llama"), device="cpu", dtype="float32", block_size=4, quantization=kind)
    layers = llm.engine.runner.model.model.layers
    projections = [m for layer in layers for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                   layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    assert all(m.qweight is not None and m.qweight.blocked is not None and m.qweight.kind == kind
               for m in projections)
    prompts = [list(range(5, 16)), list(range(40, 46)), list(range(7, 9))]
    (fused_logits, *_), (module_logits, *_) = _decode_pass(llm, prompts)
    torch.testing.assert_close(fused_logits, module_logits, atol=2e-5, rtol=1e-5)
    assert all(layer.fused.args.qkv.kind == {"int8": 1, "int4": 2}[kind] for layer in layers)


def test_verify_and_prefill_rows_attend_causally_in_the_fused_layer(checkpoint):
    """A pass mixing a 6-token chunk of one sequence (a prefill chunk, or a verify pass's k + 1
    rows) with decode rows of others: every row a query of its own over its sequence's pages,
    the chunk's rows seeing each other causally. The same logits as the modules."""
    llm = LLM(checkpoint("mistral"), device="cpu", dtype="float32", block_size=4)
    engine = llm.engine
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(4, 300, (n,), generator=g).tolist() for n in (17, 5, 11)]
    seqs = [forward.admit(engine, ids, f"m{i}") for i, ids in enumerate(prompts)]
    forward.run(engine, [seqs[0]], 11)  # the first 11 of 17, then a chunk of 6
    for s in seqs[1:]:
        forward.run(engine, [s], len(s) - 1)
    layers = engine.runner.model.model.layers
    spec = CaptureSpec(attention_layers=[0], heads=None, max_keys=64, moe=False, embed_dims=0)
    out = []
    try:
        for fuse in (True, False):
            for layer in layers:
                layer.fusable = fuse
            batch = forward.prepare(engine, seqs)  # the chunk of 6 and the others' last tokens
            assert not batch.decode_only and batch.input_ids.shape[0] == 8
            logits, attention, _ = _run(engine, batch, [spec] * 3)
            out.append((logits, attention))
    finally:
        for seq in seqs:
            engine.block_manager.free_seq(seq)
    (fused_logits, fused_attn), (module_logits, module_attn) = out
    torch.testing.assert_close(fused_logits, module_logits, atol=2e-5, rtol=1e-5)
    for b in range(3):
        assert fused_attn[b].layers == module_attn[b].layers == [0]
        torch.testing.assert_close(fused_attn[b].probs, module_attn[b].probs, atol=2e-4, rtol=0)


def test_long_prefill_and_unpacked_layers_keep_their_modules(checkpoint, monkeypatch):
    calls = []
    real = fused.forward
    monkeypatch.setattr(fused, "forward", lambda *a: calls.append(a[2].shape[0]) or real(*a))
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm = LLM(checkpoint("llama"), device="cpu", dtype="float32", block_size=4)
    layers = llm.engine.runner.model.model.layers
    stack = fused.stack_forward  # every layer fused in one call: counted as a call per layer
    monkeypatch.setattr(fused, "stack_forward", lambda st, x, b, m, *c: calls.extend([x.shape[0]] * len(layers))
                        or stack(st, x, b, m, *c))
    llm.generate([list(range(5, 12))], greedy)  # a 7-token prefill and 3 decode steps, all fused
    assert calls == [7] * len(layers) + [1] * 3 * len(layers)
    calls.clear()
    most = layers[0].fused.max_rows  # MAX_ROWS, or the C kernel's prefill rows (kernels.cpu.kernel_rows)
    assert most == min(fused.PREFILL_ROWS, cpu_kernels.kernel_rows(torch.float32))
    llm.generate([list(range(44, 4, -1))], SamplingParams(temperature=0, max_tokens=1))  # 40 rows, no cached prefix
    assert calls == ([40] * len(layers) if most >= 40 else [])  # a prefill chunk in C where the kernel takes it
    calls.clear()
    llm.generate([[9] + list(range(5, 5 + most))], SamplingParams(temperature=0, max_tokens=1))  # past it: modules
    assert not calls
    from engine.layers.linear import pack_weights
    pack_weights(llm.engine.runner.model, on=False)  # oneDNN / PyTorch's matmul: no blocked weights
    llm.generate([list(range(5, 12))], greedy)
    assert not calls and all(layer.fused is None for layer in layers)
