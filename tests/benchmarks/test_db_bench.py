"""The trace database's bench section keeps working (tiny settings; no timing is asserted)."""
import math

from benchmarks.bench.cli import main


def test_db_section_compares_the_database_with_none_and_loads_a_replay(checkpoint):
    rows = main(["--quick", "--model", str(checkpoint("llama")), "--device", "cpu", "--out", "", "--sections", "db"])
    by_name = {r.name: r for r in rows if r.section == "trace database"}
    assert len(by_name) == 3 and all(math.isfinite(r.value) and r.value > 0 for r in by_name.values())
    assert by_name["stream at level full, SQLite on: tok/s"].baseline > 0
    assert any(name.startswith("replay load of a") and "MiB of JSON" in r.note for name, r in by_name.items())
