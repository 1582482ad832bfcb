"""benchmarks/disagg.py: the reference table's arithmetic, and one small measured run."""
from __future__ import annotations

import pytest

from benchmarks import disagg as bench


def test_bytes_per_token_and_the_links_that_keep_the_handover_under_a_tenth():
    # bf16: 2 x layers x KV heads x head dim x 2 B; MLA: layers x (512 + 64) x 2 B
    assert bench.kv_bytes_per_token("Llama-3-8B") == 2 * 32 * 8 * 128 * 2 == 131_072
    assert bench.kv_bytes_per_token("Llama-3-70B") == 2 * 80 * 8 * 128 * 2 == 327_680
    assert bench.kv_bytes_per_token("DeepSeek-V3") == 61 * 576 * 2 == 70_272
    for name in bench.ACTIVE_PARAMS:
        need = bench.min_link_gbit(name) * 1e9 / 8  # bytes/s
        assert bench.handover_share(name, need) == pytest.approx(bench.BUDGET)
    table = {r["model"]: r["share_of_prefill"] for r in bench.reference_table()}
    # 8B: many KV bytes per FLOP; 100 Gb/s Ethernet is too slow for it, NVLink and 400 Gb/s RDMA are not
    assert table["Llama-3-8B"]["100 Gb/s Ethernet"] > bench.BUDGET > table["Llama-3-8B"]["400 Gb/s RDMA"]
    assert all(v < bench.BUDGET for v in table["DeepSeek-V3"].values())  # MLA's latent: few bytes a token
    text = bench.report({**bench._empty_result(), "reference": bench.reference_table()})
    assert "131,072" in text and "DeepSeek-V3" in text


@pytest.mark.slow  # two engines and a prefill process
def test_the_mixed_workload_runs_both_ways_with_equal_tokens(checkpoint):
    w = bench.Workload(streams=2, stream_tokens=12, long=2, long_tokens=40, every_s=0.05, chunk=16)
    r = bench.measure(str(checkpoint("llama")), w, rounds=1)
    assert r["tokens_equal"] is True
    one, two = r["colocated, 1 core"], r["disaggregated, both on that core"]
    assert one["transfer_share_of_ttft"] == 0 and 0 < two["transfer_share_of_ttft"] < 1
    assert two["transfer_ms_median"] >= two["wire_ms_median"] > 0 and one["wire_ms_median"] == 0
    assert one["gap_p99_ms"] >= one["gap_p50_ms"] > 0
    assert "disaggregated, both on that core" in bench.report({**r, "reference": bench.reference_table()})
