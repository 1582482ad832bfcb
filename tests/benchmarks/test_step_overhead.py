"""The bench's step section (benchmarks/bench/step_overhead.py): a batch-1 decode step's calls
counted exactly, and its time outside the C calls of the layers and the LM head."""
from __future__ import annotations

from benchmarks.bench.context import QUICK, Bench
from benchmarks.bench.step_overhead import count_calls, step_overhead
from engine.kernels import cpu as cpu_kernels


def test_counts_and_the_time_outside_the_c_calls(checkpoint, cpu_kernels_switch):
    cpu_kernels_switch(True)
    b = Bench(checkpoint("mixtral"), None, "cpu", QUICK)
    step_overhead(b)
    calls, outside = b.rows
    assert calls.unit == "calls" and calls.value > 20 and "calls into C" in calls.note
    assert outside.unit == "us" and 0 < outside.value < outside.baseline  # part of the whole step
    lib = cpu_kernels.library()
    assert lib.tt_decode_stack.__class__.__name__ != "function"  # the timing wrappers taken off again


def test_counting_sees_every_step_and_leaves_no_hook(checkpoint, cpu_kernels_switch):
    import sys
    cpu_kernels_switch(True)
    b = Bench(checkpoint("mixtral"), None, "cpu", QUICK)
    engine = b.engine()
    free = engine.block_manager.num_free_blocks
    few, many = count_calls(engine, b.prompts[0], 3), count_calls(engine, b.prompts[0], 9)
    assert sys.getprofile() is None
    assert abs(few["call"] - many["call"]) <= 0.25 * many["call"]  # per step, not per run
    assert not engine.has_unfinished_requests()  # each request released: its pages back
    assert engine.block_manager.num_free_blocks == free
