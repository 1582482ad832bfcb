"""The bench's kernels16 section (benchmarks/bench/kernels16.py): a row per 16-bit dtype and row
count, each against float32 timed in the same interleaved passes, on one thread."""
from __future__ import annotations

import torch

from benchmarks.bench.context import QUICK, Bench
from benchmarks.bench.kernels16 import kernels16


def test_a_row_per_dtype_and_row_count_against_float32(checkpoint, cpu_kernels_switch):
    cpu_kernels_switch(True)
    threads = torch.get_num_threads()
    b = Bench(checkpoint("llama"), None, "cpu", QUICK)
    kernels16(b)
    assert torch.get_num_threads() == threads  # put back
    names = [r.name for r in b.rows]
    assert len(names) == 4 and all(r.unit == "ms" and r.value > 0 and r.baseline > 0 for r in b.rows)
    assert [n.split(", ")[-1] for n in names] == ["1 rows", "1 rows", f"{QUICK.batch} rows", f"{QUICK.batch} rows"]
    assert names[0].startswith("bfloat16") and names[1].startswith("float16")
