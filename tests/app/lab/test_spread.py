"""Verdicts from the spread of repeats: a ratio is named only when the settings' ranges do not
overlap, and two copies of one arm, run for real, are within the spread (the repeats a run
carries and the error bars: tests/app/lab/test_batching.py, on its ci run)."""
import statistics

import pytest

from app.lab import Setting, run
from app.lab.batching import settings
from visualizers.lab import bars
from visualizers.lab_verdict import count, seconds, share


def test_the_same_arm_twice_is_within_the_spread():
    """Two copies of static batching, run for real and interleaved: whatever the machine's noise,
    no repeat range of one lies wholly beside the other's (at 7 repeats that happens by chance
    in 1 run of ~1,700), so neither the CPU time nor the wall clock gets a verdict."""
    arm = settings("ci")[0].options | {"output_tokens": [6, 1, 2, 3]}
    twins = [Setting("static-together", "static, together", arm), Setting("continuous-together", "static again", arm)]
    out = run("batching", size="ci", repeats=7, settings=twins).to_json()
    assert out["repeats"] == 7 and all(len(s["repeats"]) == 7 for s in out["settings"])
    said = out["sentences"][0]
    assert "the difference in CPU time is within the spread of 7 repeats" in said
    assert "the difference in wall-clock time is within the spread of 7 repeats" in said
    assert "no conclusion at this size" in said
    assert count(out["settings"][0], "steps") == count(out["settings"][1], "steps") == "6"


def spread_of(values):
    return {"setting": {"label": "x"}, "metrics": {"t": statistics.median(values)},
            "spread": {"t": {"median": statistics.median(values), "min": min(values), "max": max(values),
                             "n": len(values), "values": values}}}


def test_a_verdict_names_the_ratio_only_when_the_ranges_part():
    fast, slow = spread_of([1.0, 1.1, 0.9]), spread_of([2.0, 2.2, 1.8])
    said = share(fast, slow, "t", "a took {pct} of b's time", "time", seconds)
    assert said == "a took 50% of b's time (range 50%–50% over 3 repeats)"
    near = spread_of([1.0, 1.9, 1.2])
    said = share(near, slow, "t", "a took {pct} of b's time", "time", seconds)
    assert said.startswith("the difference in time is within the spread of 3 repeats") and "1.00 s–1.90 s" in said
    one = {"setting": {"label": "y"}, "metrics": {"t": 1.0}}
    assert "(one run: no spread to judge it by)" in share(one, one, "t", "{pct}", "time", seconds)


def test_bars_without_repeats_draw_no_whiskers():
    s = {"setting": {"label": "a"}, "metrics": {"t": 1.0}}
    fig = bars([s], [("t", "t", "s")], "title")
    assert fig["data"][0]["error_y"]["array"] == [0] and fig["layout"]["title"]["text"] == "title"
