"""The benchmark command keeps working (tiny settings; no timing is asserted)."""
import json
import math
import re

import pytest
import torch

from benchmarks.bench.bandwidth import bandwidth_bound, decode_bytes_per_token, measured_bandwidth
from benchmarks.bench.cli import main
from benchmarks.bench.context import QUICK, Bench
from benchmarks.bench.gpu import kernels
from benchmarks.bench.timing import repeat_spread
from engine.layers.linear import Linear
from tests.engine_utils import DEVICE
from tests.real_models import cached_gguf
from tests.tiny import make_checkpoint


@pytest.mark.slow  # every section of the bench, each against its baseline (~20 s)
def test_bench_quick_runs_every_section(checkpoint, tmp_path, capsys):
    draft = make_checkpoint("llama", tmp_path / "draft", seed=3, num_layers=1)
    rows = main(["--quick", "--model", str(checkpoint("mixtral")), "--draft", str(draft),
                 "--device", "cpu", "--out", str(tmp_path / "results"),
                 "--sections", "transformers,tracing,bandwidth,batching,speculative,prefix,gpu,memory"])
    sections = {r.section for r in rows}
    assert sections == {"decode vs transformers", "tracing cost", "bandwidth", "batching", "speculative (k=4)",
                        "prefix caching", "memory"}
    assert all(math.isfinite(r.value) for r in rows)  # tiny runs: no claim about speed
    notes = [r.note for r in rows if r.section == "decode vs transformers"]
    # every repeat is counted: one a busy machine stalled is named as left out, never dropped unsaid
    assert notes and all(re.match(r"greedy tokens identical; ratio over (1 of )?2 interleaved repeats: ", n)
                         for n in notes), notes
    out = capsys.readouterr().out
    assert "ratio" in out and "trace full: tok/s" in out and "trace off, alternate steps" in out
    assert "95% CI" in next(r.note for r in rows if r.name.startswith("trace off, alternate"))
    (result,) = (tmp_path / "results").glob("bench-*.json")
    data = json.loads(result.read_text())
    assert data["machine"]["cpu_count"] >= 1 and len(data["rows"]) == len(rows)


def test_decode_bytes_per_token_counts_what_one_step_reads(checkpoint):
    """The HBM-bound row's denominator, by hand for the tiny checkpoints (float32): a MoE
    step reads 2 of its 4 experts and one embedding row; a tied LM head reads the table."""
    from engine.llm_engine import LLMEngine
    moe = LLMEngine(checkpoint("mixtral"), device=DEVICE, dtype="float32")
    h, i, v, ctx = 64, 96, 320, 10
    attn = h * (h + 2 * 32) + h * h  # q, k, v (2 kv heads x 16) and o
    experts = 2 * (2 * i * h + h * i)  # top 2 of 4: gate+up and down
    layer = attn + h * 8 + experts + 2 * h  # router (4 rows, blocked for the C kernel: padded to 8), two norms
    kv = 2 * 3 * 2 * 16 * ctx  # K and V, 3 layers, 2 kv heads x 16, ctx tokens
    expected = 4 * (3 * layer + h + h + v * h + kv)  # + final norm, one embedding row, LM head
    assert decode_bytes_per_token(moe.runner.model, moe.model_config, ctx) == expected
    dense = LLMEngine(checkpoint("llama"), device=DEVICE, dtype="float32")
    layer = attn + 3 * h * i + 2 * h
    assert dense.model_config.tie_word_embeddings
    assert decode_bytes_per_token(dense.runner.model, dense.model_config, ctx) == 4 * (3 * layer + h + v * h + kv)


def test_bandwidth_row_arithmetic(checkpoint):
    """The bandwidth row on the CPU (tiny sizes): achieved GB/s is tok/s times the bytes one
    step reads, the baseline the measured copy bandwidth, the bound their quotient."""
    b = Bench(checkpoint("mixtral"), None, "cpu", QUICK)
    bandwidth_bound(b, copy_bytes=1 << 20)
    row, *linears = b.rows
    engine = b.engine()
    # the C kernel's rows (where it builds): the model's linears alone at 1 and batch rows
    layers = [m for m in engine.runner.model.modules() if isinstance(m, Linear) and m.blocked is not None]
    assert [r.name for r in linears] == ([] if not layers else [
        "linear layers alone, 1 row: C kernel vs oneDNN, GB/s",
        f"linear layers alone, {QUICK.batch} rows: C kernel vs oneDNN, GB/s"])
    nbytes = sum(m.blocked.nbytes for m in layers)
    for r in linears:
        assert r.value > 0 and r.baseline > 0 and f"{len(layers)} layers, {nbytes / 2**20:.0f} MiB" in r.note
    context = QUICK.prompt_tokens + QUICK.new_tokens // 2
    read = decode_bytes_per_token(engine.runner.model, engine.model_config, context)
    kv = read - decode_bytes_per_token(engine.runner.model, engine.model_config, 0)
    assert kv == engine.model_config.kv_bytes_per_token * 4 * context  # float32
    rate = row.value * 1e9 / read
    assert row.unit == "GB/s" and row.value > 0 and row.baseline > 0
    assert f"{rate:.1f} tok/s x {read / 2**20:.1f} MiB read per token" in row.note
    assert f"({kv / 2**20:.2f} MiB of it KV, {context} tokens)" in row.note
    assert f"bound {row.baseline * 1e9 / read:.1f} tok/s" in row.note
    # the baseline is the better of the two copies measured (all threads, one thread)
    all_threads, one = row.note.split("copy: ")[1].split(", ")
    copies = [float(all_threads.split(" GB/s")[0]), float(one.split(" GB/s")[0])]
    assert row.baseline == pytest.approx(max(copies), rel=5e-3)
    assert row.ratio == pytest.approx(row.value / row.baseline)


def test_measured_bandwidth_on_cpu():
    """A STREAM-style copy: bytes read + written over the time; sensible magnitude on any
    machine (above 0.1 GB/s, below 10 TB/s), and the thread setting is restored."""
    threads = torch.get_num_threads()
    for n in (None, 1):
        bw = measured_bandwidth("cpu", 1 << 22, threads=n)
        assert 1e8 < bw < 1e13
    assert torch.get_num_threads() == threads


def test_gpu_rows_compute_on_cpu(checkpoint, tmp_path):
    """The CUDA-only rows, run on the CPU with tiny sizes (Triton interpreted): whatever the
    speed (nothing here is a measurement claim), each is a rate against its baseline."""
    pytest.importorskip("triton")
    b = Bench(checkpoint("mixtral"), None, "cpu", QUICK)
    kernels(b, torch.float32, (2, 4, 2, 16, 4, 16), repeats=1)
    attention, store = b.rows
    assert all(r.value > 0 and r.baseline > 0 and r.unit == "calls/s" for r in (attention, store))


@pytest.mark.slow  # a real model, against transformers
def test_bench_real_section_runs_on_smollm2(tmp_path):
    """The real-checkpoint rows: SmolLM2 from its GGUF against transformers on the same file."""
    cached_gguf("smollm2")
    rows = main(["--quick", "--device", "cpu", "--out", "", "--sections", "real"])
    assert {r.section for r in rows} == {"SmolLM2-135M-Instruct: decode vs transformers",
                                         "SmolLM2-135M-Instruct: tracing cost", "SmolLM2-135M-Instruct: bandwidth"}
    assert all(re.match(r"greedy tokens identical; ratio over (1 of )?2 interleaved repeats", r.note)
               for r in rows if r.section.endswith("transformers"))


def test_repeat_spread_is_per_repeat_decode_ratios():
    # repeat 1: baseline decodes in 9 s, ours in 4.5 s (2x); repeat 2: 10 s vs 2.5 s (4x)
    assert repeat_spread([10, 12], [1, 2], [5, 3.5], [0.5, 1]) == "ratio over 2 interleaved repeats: 2.00-4.00"
    assert repeat_spread([1], [1], [1], [1]) == ""  # no decode time to divide by
    assert repeat_spread([10, 12], [1, 2], [5, 1], [0.5, 1]) == (
        "ratio over 1 of 2 interleaved repeats: 2.00-2.00 (1 left out: its one-token run took as long as its whole run)")


@pytest.mark.slow  # a real model at three dtypes, and two fresh processes for the memory rows
def test_bench_precision_section_on_smollm2():
    """16-bit weights on SmolLM2: speed rows against float32, agreement with float32 (as the
    quant section measures it), resident memory within 1.15x of weights + KV pool."""
    cached_gguf("smollm2")
    rows = main(["--quick", "--device", "cpu", "--out", "", "--sections", "precision"])
    by = {r.name: r for r in rows}
    assert {r.section for r in rows} == {f"SmolLM2-135M-Instruct: 16-bit weights {s}"
                                         for s in ("decode", "agreement", "memory")}
    for dtype in ("bfloat16", "float16"):
        assert by[f"{dtype} batch 1 decode tok/s"].baseline > 0
        assert by[f"{dtype}: top-1 = float32's, teacher-forced"].value >= 95
        assert by[f"{dtype}: mean KL(float32 || {dtype})"].value < 5  # mnats
    for dtype in ("float32", "bfloat16"):
        r = by[f"{dtype}: resident growth of a load"]
        assert r.value <= 1.15 * r.baseline
