"""The benchmark command keeps working (tiny settings; no timing is asserted)."""
import json
import math

import pytest
import torch

from engine import bench
from tests.engine_utils import DEVICE
from tests.tiny import make_checkpoint


def test_bench_quick_runs_every_section(checkpoint, tmp_path, capsys):
    draft = make_checkpoint("llama", tmp_path / "draft", seed=3, num_layers=1)
    rows = bench.main(["--quick", "--model", str(checkpoint("mixtral")), "--draft", str(draft),
                       "--device", "cpu", "--out", str(tmp_path / "results"),
                       "--sections", "transformers,tracing,batching,speculative,prefix,gpu,memory"])
    sections = {r.section for r in rows}
    assert sections == {"decode vs transformers", "tracing cost", "batching", "speculative (k=4)",
                        "prefix caching", "memory"}
    assert all(math.isfinite(r.value) for r in rows)  # tiny runs: no claim about speed
    assert "greedy tokens identical" in {r.note for r in rows if r.section == "decode vs transformers"}
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
    layer = attn + h * 4 + experts + 2 * h  # router, two norms
    kv = 2 * 3 * 2 * 16 * ctx  # K and V, 3 layers, 2 kv heads x 16, ctx tokens
    expected = 4 * (3 * layer + h + h + v * h + kv)  # + final norm, one embedding row, LM head
    assert bench.decode_bytes_per_token(moe.runner.model, moe.model_config, ctx) == expected
    dense = LLMEngine(checkpoint("llama"), device=DEVICE, dtype="float32")
    layer = attn + 3 * h * i + 2 * h
    assert dense.model_config.tie_word_embeddings
    assert bench.decode_bytes_per_token(dense.runner.model, dense.model_config, ctx) == 4 * (3 * layer + h + v * h + kv)


def test_gpu_rows_compute_on_cpu(checkpoint, tmp_path):
    """The CUDA-only rows, run on the CPU with tiny sizes (Triton interpreted): their
    arithmetic holds, whatever the speed (nothing here is a measurement claim)."""
    pytest.importorskip("triton")
    b = bench.Bench(checkpoint("mixtral"), None, "cpu", bench.QUICK)
    b.bandwidth_bound(copy_bytes=1 << 20)
    b.kernels(torch.float32, (2, 4, 2, 16, 4, 16), repeats=1)
    bound, attention, store = b.rows
    engine = b.engine()
    read = bench.decode_bytes_per_token(engine.runner.model, engine.model_config,
                                        bench.QUICK.prompt_tokens + bench.QUICK.new_tokens // 2)
    # the bound is the measured bandwidth over the bytes one step reads
    gbs = float(bound.note.split(" at ")[1].split(" GB/s")[0])
    assert f"{read / 2**20:.1f} MiB read per token" in bound.note
    assert bound.baseline * read / 1e9 == pytest.approx(gbs, rel=5e-3)
    assert all(r.value > 0 and r.baseline > 0 and r.unit == "calls/s" for r in (attention, store))


def test_bench_real_section_runs_on_smollm2(tmp_path):
    """The real-checkpoint rows: SmolLM2 from its GGUF against transformers on the same file."""
    from tests.test_real_models import _gguf
    _gguf("smollm2")
    rows = bench.main(["--quick", "--device", "cpu", "--out", "", "--sections", "real"])
    assert {r.section for r in rows} == {"SmolLM2-135M-Instruct: decode vs transformers",
                                         "SmolLM2-135M-Instruct: tracing cost"}
    assert {r.note for r in rows if r.section.endswith("transformers")} == {"greedy tokens identical"}
