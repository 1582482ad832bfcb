"""The bench's tracing section states full tracing's cost against a bound, and the exact logit
lens's arithmetic floor (benchmarks/bench/tracing.py full_bound, lens_floor). Tiny settings on a
tiny checkpoint: the rows and their arithmetic are checked, never a timing."""
from __future__ import annotations

import re

import pytest

from benchmarks.bench.context import QUICK, Bench
from benchmarks.bench.tracing import (CAPTURE_BUDGET_MS, CAPTURE_BUDGET_PER_LAYER_MS, lens_floor, tracing)
from engine.checkpoint.resolve import load_config
from engine.kernels import cpu as cpu_kernels
from engine.llm_engine import LLMEngine


@pytest.fixture(scope="module")
def rows(checkpoint):
    b = Bench(checkpoint("mixtral"), None, "cpu", QUICK)
    tracing(b)
    return {r.name: r for r in b.rows}


def test_the_section_states_full_tracings_cost_against_its_bound(rows, checkpoint):
    cfg = load_config(checkpoint("mixtral"))
    full = rows["trace full: ms a token against its bound"]
    lens = rows["logit lens: ms a token against its float32 floor"]
    assert full.unit == lens.unit == "ms" and full.section == lens.section == "tracing cost"
    floor = float(re.search(r"lens floor ([0-9.]+)", full.note).group(1))
    assert floor == pytest.approx(lens.baseline, abs=1e-3)  # one floor in both rows
    budget = CAPTURE_BUDGET_MS + CAPTURE_BUDGET_PER_LAYER_MS * cfg.num_layers
    assert full.baseline == pytest.approx(lens.baseline + budget)
    assert full.note.startswith("holds" if full.value <= full.baseline else "EXCEEDED")
    assert re.search(r"load average [0-9.]+$", full.note)  # a time is read beside the machine's load
    # the cost a token is the same quantity the tok/s rows give, from the same runs
    rate0 = rows["trace full: tok/s"].baseline
    assert rate0 == rows["trace full, no logit lens: tok/s"].baseline
    assert full.value == pytest.approx(1e3 * (1 / rows["trace full: tok/s"].value - 1 / rate0), abs=5.0)


def test_the_floor_is_the_lens_rows_multiply_adds_over_the_measured_rate(rows, checkpoint):
    cfg = load_config(checkpoint("mixtral"))
    lens = rows["logit lens: ms a token against its float32 floor"]
    macs = cfg.num_layers * cfg.hidden_size * cfg.vocab_size
    m = re.search(r"floor: ([0-9.]+) M multiply-adds a token \((\d+) rows x (\d+) x (\d+)\) at ([0-9.]+) G/s",
                  lens.note)
    assert m, lens.note
    assert [int(m.group(i)) for i in (2, 3, 4)] == [cfg.num_layers, cfg.hidden_size, cfg.vocab_size]
    assert float(m.group(1)) == pytest.approx(macs / 1e6, abs=0.05)
    rate = float(m.group(5)) * 1e9
    assert lens.baseline == pytest.approx(1e3 * macs / rate, rel=0.06)  # the note's rate is rounded


def test_lens_floor_counts_the_lens_rows_of_the_model(checkpoint):
    engine = LLMEngine(checkpoint("llama"), device="cpu")
    cfg = engine.model_config
    f = lens_floor(engine, repeats=3)
    assert f.macs == cfg.num_layers * cfg.hidden_size * cfg.vocab_size  # the lens's L rows, not L + 1
    assert f.rows in (cfg.num_layers + 1, cpu_kernels.MAX_ROWS)  # the lens's own call, or the kernel's most rows
    assert f.rate > 0 and f.ms == pytest.approx(1e3 * f.macs / f.rate)
