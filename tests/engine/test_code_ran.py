"""schedule.step's `attention` (engine/code_ran.py) names the way a pass's attention really
ran: each pass of a traced request is run with spies on the functions of each way (the fused
C layer, the C decode kernel, plain torch's prefill and decode), and the name the trace gives
that step must be the way whose functions were called."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams, TraceEvent
from engine.block_manager import chain_hash
from engine.kernels import cpu as cpu_kernels
from engine.layers import attention, fused
from tests.pass_spies import record_passes, spy

PROMPT = [5, 9, 14, 3, 22, 7, 30, 11]  # 8 tokens: a short prefill, within the fused layer's rows


def _ways(monkeypatch, llm: LLM, prompt: list[int]) -> list[tuple[str, set]]:
    """(the trace's attention for the step, the ways whose functions ran in its pass) a step."""
    passes = record_passes(monkeypatch, llm.engine.runner)
    spy(monkeypatch, passes, fused, "forward", "c_fused")
    spy(monkeypatch, passes, fused, "stack_forward", "c_fused")
    spy(monkeypatch, passes, cpu_kernels, "decode_attention", "c_kernel")
    spy(monkeypatch, passes, attention, "prefill_attention", "torch")
    spy(monkeypatch, passes, attention.F, "scaled_dot_product_attention", "torch")
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    steps, way = [], ""
    llm.said = []
    for i in llm.stream(prompt, params=params, trace="basic"):
        if isinstance(i, TraceEvent) and i.type == "schedule.step":  # said where it is news: carried on
            llm.said.append(i.data.get("attention"))
            way = i.data.get("attention") or way
            steps.append(way)
    assert len(steps) == len(passes) == 4
    return list(zip(steps, passes))


@pytest.fixture
def llm(checkpoint):
    return LLM(checkpoint("llama"), device="cpu", block_size=4)


def test_the_fused_c_layer_where_it_runs(monkeypatch, cpu_kernels_switch, llm):
    cpu_kernels_switch(True)
    for said, ran in _ways(monkeypatch, llm, PROMPT):
        assert said == "c_fused" and ran == {"c_fused"}
    assert llm.said == ["c_fused", None, None, None]  # said once: no news at the decode steps, no bytes


def test_the_c_decode_kernel_where_layers_are_not_fused(monkeypatch, cpu_kernels_switch, llm):
    cpu_kernels_switch(True)
    for layer in llm.engine.runner.model.model.layers:
        layer.fusable = False
    (said, ran), *decodes = _ways(monkeypatch, llm, PROMPT)
    assert said == "torch" and ran == {"torch"}  # the prefill
    for said, ran in decodes:
        assert said == "c_kernel" and ran == {"c_kernel"}
    assert llm.said == ["torch", "c_kernel", None, None]


def test_plain_torch_without_the_c_kernels(monkeypatch, cpu_kernels_switch, checkpoint):
    cpu_kernels_switch(False)
    llm = LLM(checkpoint("llama"), device="cpu", block_size=4)
    for said, ran in _ways(monkeypatch, llm, PROMPT):
        assert said == "torch" and ran == {"torch"}


def test_a_long_prompt_prefills_in_torch_then_decodes_fused(monkeypatch, cpu_kernels_switch, llm):
    cpu_kernels_switch(True)
    # past the rows a plan takes (MAX_ROWS, or the C kernel's prefill rows on an AVX-512 build)
    (said, ran), *decodes = _ways(monkeypatch, llm, (PROMPT * 40)[:fused.widest_rows() + 8])
    assert said == "torch" and ran == {"torch"}
    assert all(s == "c_fused" and r == {"c_fused"} for s, r in decodes)


def test_a_prefix_hit_reports_the_chain_hashes_it_found(llm):
    prompt = PROMPT + [40, 41, 42, 43]  # 12 tokens: 2 full blocks of 4 are looked up (never the last token)
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    looked = []
    for _ in range(2):
        looked += [i.data for i in llm.stream(prompt, params=params, trace="basic")
                   if isinstance(i, TraceEvent) and i.type == "prefix_cache.lookup"]
    first, second = looked
    assert not first["hit"] and "hashes" not in first
    h0 = chain_hash(None, tuple(prompt[:4]))
    assert second["hit"] and second["hashes"] == [h0, chain_hash(h0, tuple(prompt[4:8]))]
