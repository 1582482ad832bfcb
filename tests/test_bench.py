"""The benchmark command keeps working (tiny settings; no timing is asserted)."""
import json
import math

from engine import bench
from tests.tiny import make_checkpoint


def test_bench_quick_runs_every_section(checkpoint, tmp_path, capsys):
    draft = make_checkpoint("llama", tmp_path / "draft", seed=3, num_layers=1)
    rows = bench.main(["--quick", "--model", str(checkpoint("mixtral")), "--draft", str(draft),
                       "--device", "cpu", "--out", str(tmp_path / "results")])
    sections = {r.section for r in rows}
    assert sections == {"decode vs transformers", "tracing cost", "batching", "speculative (k=4)",
                        "prefix caching", "memory"}
    assert all(math.isfinite(r.value) for r in rows)  # tiny runs: no claim about speed
    assert "greedy tokens identical" in {r.note for r in rows if r.section == "decode vs transformers"}
    out = capsys.readouterr().out
    assert "ratio" in out and "trace full: tok/s" in out
    (result,) = (tmp_path / "results").glob("bench-*.json")
    data = json.loads(result.read_text())
    assert data["machine"]["cpu_count"] >= 1 and len(data["rows"]) == len(rows)
