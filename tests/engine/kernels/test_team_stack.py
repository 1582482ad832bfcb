"""A dense pass's layers in one OpenMP region (cpu_team.c, taken by cpu_layer.c's tt_decode_stack
when engine/layers/fused.py's TEAM is on and more than one thread runs): the same logits, bit for
bit, as one region a matrix, at every float weight type, for plain, Qwen3 (q/k head norms) and
Gemma 3 (sandwich norms, GeGLU, sliding windows) layers, several rows, a `full` trace's captures,
and a context long enough that attention's tasks are shared too."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, forward
from engine.kernels import cpu
from engine.layers import fused
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.trace import EventList, Tracer
from engine.trace.tracer import CaptureConfig
from tests.tiny import make_checkpoint


@pytest.fixture(autouse=True)
def two_threads(cpu_kernels_switch, monkeypatch):
    """Two threads, and every one-call pass checked to be one the team path takes."""
    cpu_kernels_switch(True)  # skips without a compiler (fails where CI requires the kernels)
    real = fused.stack_forward

    def checked(st, *a, **k):
        assert cpu.library().tt_team_fits(st.layers, len(st.plans)) == 1
        STACKED.append(1)
        return real(st, *a, **k)
    monkeypatch.setattr(fused, "stack_forward", checked)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


STACKED: list[int] = []


def _decode(llm: LLM, prompts: list[list[int]], team: bool) -> torch.Tensor:
    """One decode pass over each prompt's last token (the rest prefilled): its logits."""
    engine = llm.engine
    seqs = [forward.admit(engine, ids, f"s{i}") for i, ids in enumerate(prompts)]
    fused.TEAM = team
    try:
        for seq in seqs:
            forward.run(engine, [seq], len(seq) - 1)
        batch = forward.prepare(engine, seqs)
        STACKED.clear()
        logits = engine.runner.run(batch, None, None)
        assert STACKED, "the pass did not take the one-call stack"
        return logits
    finally:
        fused.TEAM = True
        for seq in seqs:
            engine.block_manager.free_seq(seq)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_one_region_equals_one_region_a_matrix(checkpoint, arch, dtype):
    llm = LLM(checkpoint(arch), device="cpu", dtype=dtype, block_size=4)
    for prompts in ([list(range(3, 12))], [list(range(3, 3 + n)) for n in (5, 9, 14)]):
        team = _decode(llm, prompts, True)
        apart = _decode(llm, prompts, False)
        assert torch.equal(team, apart)


def _traced(path, levels: list[str], team: bool, prompt: int = 12) -> list[dict]:
    """A traced run's events, timings left out (prompts of `prompt` tokens and more)."""
    sink = EventList()
    # the lenses at the finish: when a lens batch runs must not hang on the machine's speed
    engine = LLMEngine(path, device="cpu", dtype="bfloat16", tracer=Tracer(sink),
                       capture=CaptureConfig(lens_live_seconds=None))
    fused.TEAM = team
    try:
        for i, level in enumerate(levels):
            engine.add_request([5 + (i + j * 7) % 200 for j in range(prompt + 2 * i)], SamplingParams(temperature=0, max_tokens=5,
                               ignore_eos=True), trace_level=level, request_id=f"r{i}")
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        fused.TEAM = True
    timings = {"ts", "start", "schedule_seconds", "sample_seconds", "forward_seconds", "t", "latency", "seconds",
               "trace_seconds", "lens_seconds", "metrics", "ttft", "ttft_split", "token_latencies", "tokenized_at"}
    return [{k: v for k, v in e.to_dict().items() if k not in timings} for e in sink.events]


def test_a_full_trace_keeps_the_same_captures(checkpoint):
    team, apart = (_traced(checkpoint("gemma3"), ["full", "basic"], t) for t in (True, False))
    assert {"attention", "embed", "logit_lens"} <= {e["type"] for e in team}
    assert team == apart


def test_shared_attention_writes_a_full_traces_probabilities_as_collect_reads_them(tmp_path, monkeypatch):
    """Past 2^18 keys x query dims (240 keys x 32 heads x 64) the team's threads share attention's
    tasks, and each writes its rows' probabilities (engine/trace/pass_probs.py): the events equal
    those of layers run one by one, whose probabilities collect() reads from the pool after the pass."""
    path = make_checkpoint("llama", tmp_path / "wider", num_layers=2, num_heads=32, num_kv_heads=8, hidden_size=2048)
    team = _traced(path, ["full"], True, prompt=240)
    monkeypatch.setattr(fused, "stack", lambda *a: None)
    by_layer = _traced(path, ["full"], True, prompt=240)
    assert sum(e["type"] == "attention" for e in team) == 5 and team == by_layer


def test_a_long_context_shares_attention_between_the_threads(tmp_path):
    # 16 heads x 64 dims at 256 keys: the work at which attention's tasks are split (2^18)
    path = make_checkpoint("llama", tmp_path / "wide", num_layers=2, num_heads=16, num_kv_heads=4, hidden_size=1024)
    llm = LLM(path, device="cpu", dtype="float32", block_size=16)
    prompts = [[3 + (i * 7 + j) % 200 for i in range(256)] for j in range(2)]  # the last at key 256
    team = _decode(llm, prompts, True)
    apart = _decode(llm, prompts, False)
    assert torch.equal(team, apart)


def test_the_avx2_build_takes_it_with_the_same_values(checkpoint):
    """Where the CPU has no AVX-512 (a CI machine with AVX2 only), bfloat16 multiplies by widening
    shifts: the team path on that build, in a fresh process, equals its one region a matrix."""
    import os
    import subprocess
    import sys
    flags = cpu._cpu_flags().split()
    if not {"avx2", "fma", "f16c"} <= set(flags):
        pytest.skip("this CPU cannot run an AVX2 build")
    script = (
        "import sys, torch\nfrom engine import LLM, forward\nfrom engine.kernels import cpu\n"
        "from engine.layers import fused\ntorch.set_num_threads(2)\n"
        "assert cpu.march() == 'x86-64-v3' and cpu.library().tt_linear16_path() == 0\n"
        "real, seen = fused.stack_forward, []\n"
        "fused.stack_forward = lambda st, *a: seen.append(cpu.library().tt_team_fits(st.layers, len(st.plans))) "
        "or real(st, *a)\n"
        "for dtype in ('bfloat16', 'float16'):\n"
        "    llm = LLM(sys.argv[1], device='cpu', dtype=dtype, block_size=4)\n"
        "    out = []\n"
        "    for team in (True, False):\n"
        "        fused.TEAM = team\n"
        "        seqs = [forward.admit(llm.engine, list(range(3, 3 + n)), f's{n}') for n in (6, 11)]\n"
        "        for s in seqs:\n"
        "            forward.run(llm.engine, [s], len(s) - 1)\n"
        "        out.append(llm.engine.runner.run(forward.prepare(llm.engine, seqs), None, None))\n"
        "        for s in seqs:\n"
        "            llm.engine.block_manager.free_seq(s)\n"
        "    assert torch.equal(*out), dtype\n"
        "assert seen and all(seen)\n"
        "print('ok')\n")
    env = {**os.environ, "TOKENTRACE_CPU_MARCH": "x86-64-v3"}
    done = subprocess.run([sys.executable, "-c", script, str(checkpoint("llama"))], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
