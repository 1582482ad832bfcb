"""The bench's prefill section (benchmarks/bench/prefill.py): per dtype a TTFT row against the
capped path, and a breakdown whose parts are timed by hooks the section removes after
(benchmarks.prefill_stages)."""
from __future__ import annotations

from benchmarks.bench.context import QUICK, Bench
from benchmarks.bench.prefill import prefill
from engine.kernels import cpu


def test_a_ttft_row_and_a_breakdown_per_dtype(checkpoint, cpu_kernels_switch):
    cpu_kernels_switch(True)
    path = checkpoint("llama")
    b = Bench(path, None, "cpu", QUICK)
    prefill(b, str(path))
    ttfts = [r for r in b.rows if "TTFT" in r.name]
    assert [r.name.split(" ")[0] for r in ttfts] == ["float32", "bfloat16", "float16"]
    assert all(r.value > 0 and r.baseline > 0 for r in ttfts)
    parts = {r.name.split("tokens: ")[1] for r in b.rows if "tokens: " in r.name}
    assert {"qkv matmul", "gate/up matmul", "layers fused in C", "LM head", "sampling", "tokenize"} <= parts
    fused_ms = [r.value for r in b.rows if r.name.endswith("tokens: layers fused in C")]
    assert max(fused_ms) > 0 or cpu.kernel_rows(cpu.torch.float32) == cpu.MAX_ROWS  # 37 rows in C where it takes them
    assert cpu.kernel_rows(cpu.torch.float32) >= cpu.MAX_ROWS  # the A/B put the limits back
    assert cpu.PREFILL_KERNEL_ROWS[cpu.torch.float32] == 128 and cpu.AMX_BF16_ROWS == 16
