"""schedule.step's `moe` (engine/code_ran.py moe_path) names the way a pass's MoE layers really
ran: spies on each way's functions (the fused layer's MoE half in C, the router and experts in
one C call, plain torch's router), and the name the trace gives each step must be the way whose
function was called; said only where it is news (a decode step pays no bytes)."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams, TraceEvent
from engine.layers import fused, mlp, moe_cpu
from tests.pass_spies import record_passes, spy

PROMPT = [5, 9, 14, 3, 22, 7, 30, 11]


def _ways(monkeypatch, llm: LLM) -> tuple[list[str | None], list[set]]:
    passes = record_passes(monkeypatch, llm.engine.runner)
    for owner, name, way in ((fused, "_moe_forward", "moe_c_block"), (moe_cpu.CpuExperts, "forward", "moe_c"),
                             (mlp.SparseMoE, "route", "moe_torch")):
        spy(monkeypatch, passes, owner, name, way)
    said = [i.data.get("moe") for i in llm.stream(PROMPT, params=SamplingParams(temperature=0.0, max_tokens=3,
                                                                                 ignore_eos=True), trace="basic")
            if isinstance(i, TraceEvent) and i.type == "schedule.step"]
    return said, passes


@pytest.fixture
def moe_llm(checkpoint):
    return lambda: LLM(checkpoint("qwen2_moe"), device="cpu", dtype="float32", block_size=4)


def test_the_moe_way_that_ran_is_the_one_said(monkeypatch, cpu_kernels_switch, moe_llm):
    cpu_kernels_switch(True)
    llm = moe_llm()
    said, passes = _ways(monkeypatch, llm)
    way = said[0]
    assert way in ("moe_c_block", "moe_c") and said[1:] == [None, None]  # said once, then carried on
    assert all(p == {way} for p in passes)


def test_the_moe_in_torch_without_the_c_kernels(monkeypatch, cpu_kernels_switch, moe_llm):
    cpu_kernels_switch(False)
    llm = moe_llm()
    said, passes = _ways(monkeypatch, llm)
    assert said == ["moe_torch", None, None] and all(p == {"moe_torch"} for p in passes)


def test_a_dense_model_says_no_moe_way(checkpoint):
    llm = LLM(checkpoint("llama"), device="cpu", block_size=4)
    steps = [i.data for i in llm.stream(PROMPT, params=SamplingParams(temperature=0.0, max_tokens=2), trace="basic")
             if isinstance(i, TraceEvent) and i.type == "schedule.step"]
    assert steps and all("moe" not in s for s in steps)
