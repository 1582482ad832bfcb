"""python -m app.lab: a run writes its JSON and HTML; a wrong name is a clear error."""
import json
from pathlib import Path

import pytest

from app.lab.__main__ import main
from app.lab.registry import get
from app.lab.spread import REPEATS


def test_list_names_every_experiment(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in ("batching", "chunked_prefill", "disaggregation", "speculation", "precision", "kv_capacity"):
        assert name in out


def test_an_unknown_experiment_is_a_clear_error(capsys):
    assert main(["nope"]) == 2
    assert "no experiment 'nope'" in capsys.readouterr().err


def test_a_run_writes_json_and_a_self_contained_page(tmp_path, capsys):
    j, h = tmp_path / "r.json", tmp_path / "r.html"
    assert main(["kv_capacity", "--size", "ci", "--json", str(j), "--html", str(h)]) == 0
    out, err = capsys.readouterr()
    assert "pool too small" in out and "%" in err  # the table, and the progress bar on stderr
    result = json.loads(j.read_text())
    assert result["experiment"] == "kv_capacity" and len(result["settings"]) == 2
    page = h.read_text()
    assert "<script src" not in page and "Plotly.newPlot" in page and len(page) > 1_000_000
    assert json.dumps(result["sentences"][0])[1:-1].split(":")[0] in page


def test_a_model_that_does_not_load_is_a_clear_error(tmp_path, capsys):
    assert main(["batching", "--size", "ci", "--model", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert "error:" in err and "missing" in err


def test_the_repeats_help_and_docs_name_the_defaults_the_runner_uses(capsys):
    """They said 5 at both sizes; `ci` runs 3 (app/lab/spread.py), where two copies of one arm part
    1 run in 10, not 1 in 126."""
    with pytest.raises(SystemExit):
        main(["--help"])
    said = " ".join(capsys.readouterr().out.split())
    disagg = get("disaggregation").repeats
    assert (f"default: {REPEATS['full']} at --size full, {REPEATS['ci']} at ci; disaggregation "
            f"{disagg['ci']})") in said and disagg["ci"] == disagg["full"]
    docs = " ".join((Path(__file__).parents[3] / "docs" / "experiments.md").read_text().split())
    assert f"by default {REPEATS['full']} at `full` and {REPEATS['ci']} at `ci`; disaggregation {disagg['ci']}" in docs
