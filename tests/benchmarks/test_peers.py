"""benchmarks/peers.py: this engine at each dtype side by side, peers skipped with a line
where they are not installed (nothing here is a speed claim)."""
from __future__ import annotations

import json

import pytest

from benchmarks.peer_cases import vector_unit
from benchmarks.peers import main
from engine.kernels import cpu
from engine.llm_engine import DEFAULT_MODEL


@pytest.mark.skipif(not cpu.available(), reason="16-bit weights on the CPU need the C kernels")
def test_peers_runs_this_engine_at_each_dtype_and_names_what_it_skips(capsys, tmp_path):
    rows = main(["--model", str(DEFAULT_MODEL), "--batches", "1,2", "--new-tokens", "4", "--repeats", "2",
                 "--pause", "0", "--ttft-tokens", "9", "--prefill", "40", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert [r["engine"] for r in rows[:3]] == ["this engine float32", "this engine bfloat16", "this engine float16"]
    assert rows[0]["batch 1"]["ratio"] == 1.0 and rows[0]["batch 2"]["tokens_equal"] == "8 / 8"
    assert all(isinstance(r[f"batch {b}"]["tok/s"], float) for r in rows for b in (1, 2))  # timings: noise here
    for peer, module in (("vLLM", "vllm"), ("llama.cpp", "llama_cpp")):
        try:
            __import__(module)
        except ImportError:
            assert f"{peer}: skipped" in out
    assert all(r["ttft 9"]["ms"] > 0 and r["ttft 40"]["ms"] > 0 for r in rows[:3]) and rows[0]["ttft 9"]["ratio"] == 1
    unit, family = vector_unit()
    assert f"vector unit: {unit}" in out
    saved = json.loads((tmp_path / f"peers-{family}.json").read_text())  # this CPU family's file
    assert saved["rows"] == rows and len(saved["load_average_rounds"]) == 2  # the load of each round, recorded
    assert "torch" in saved["machine"]["versions"] and saved["args"]["threads"] >= 1
    if not any(p in out for p in ("vLLM: its", "llama.cpp F")):  # no peer ran: PyTorch's GEMMs alone, a floor
        assert [f["engine"] for f in saved["gemm_floor"]] == [f"PyTorch GEMMs alone {d}"
                                                              for d in ("float32", "bfloat16", "float16")]
        assert all(f["ttft 40"]["ms"] > 0 and f["batch 2"]["tok/s"] > 0 for f in saved["gemm_floor"])
    assert saved["idle_cores"] is None or set(saved["idle_cores"]) == {"this process", "child processes"}


def test_the_vector_unit_names_the_family():
    assert vector_unit({"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16"}) == \
        ("AVX-512 with BF16/VNNI/AMX", "avx512-bf16-vnni-amx")
    assert vector_unit({"avx2", "fma", "f16c"}) == ("AVX2 (no AVX-512)", "avx2")
    assert vector_unit(set())[1] == "baseline"
