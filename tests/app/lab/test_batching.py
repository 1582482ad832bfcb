"""The batching experiment on the embedded model at size ci: static batching needs more
engine steps than continuous for the same work, no request joins a running static batch,
the figures draw what the trace says, and every setting carries its repeats' spread."""
import gc
import weakref
from collections import Counter

import pytest

import statistics

from app.lab import Lab, get, run
from app.lab.batching import LENGTHS, SLOTS, settings
from app.lab.export import to_html
from app.lab.spread import REPEATS
from engine import EngineConfig
from visualizers.lab import gantt, occupancy
from visualizers.lab_batching import figures
from visualizers.lab_verdict import compare


@pytest.fixture(scope="module")
def result():
    return run("batching", size="ci").to_json()


def by_name(result):
    return {s["setting"]["name"]: s for s in result["settings"]}


def test_static_needs_more_steps_than_continuous_for_the_same_work(result):
    s = by_name(result)
    for arrival in ("together", "staggered"):
        st, co = s[f"static-{arrival}"], s[f"continuous-{arrival}"]
        assert st["metrics"]["steps"] > co["metrics"]["steps"], arrival
        # the same work: every request ran to its own length in both
        assert [r["output_tokens"] for r in st["per_request"]] == LENGTHS["ci"]
        assert [r["output_tokens"] for r in co["per_request"]] == LENGTHS["ci"]
    # together: 8 requests in 4 slots, each static batch as long as its longest request
    assert s["continuous-together"]["metrics"]["idle_slot_steps_while_waiting"] == 0
    assert s["static-together"]["metrics"]["idle_slot_steps_while_waiting"] > 0


def test_no_request_joins_a_running_static_batch(result):
    st = by_name(result)["static-together"]
    first = {r["request_id"] for r in st["per_request"][:SLOTS]}
    second = {r["request_id"] for r in st["per_request"][SLOTS:]}
    for step in st["steps"]:
        ids = {b["request_id"] for b in step["batch"]}
        assert not (ids & first and ids & second), step["step"]
    # and continuous batching lets the second group's requests in while the first group runs
    co = by_name(result)["continuous-together"]
    ids_co = [{b["request_id"] for b in step["batch"]} for step in co["steps"]]
    f_co = {r["request_id"] for r in co["per_request"][:SLOTS]}
    s_co = {r["request_id"] for r in co["per_request"][SLOTS:]}
    assert any(ids & f_co and ids & s_co for ids in ids_co)


def test_the_engine_refuses_an_unknown_batching_policy():
    with pytest.raises(ValueError, match="batching must be one of"):
        EngineConfig(batching="sometimes")


def test_figures_draw_the_trace():
    """Gantt bars and occupancy against the setting's own schedule.step and token events."""
    exp = get("batching")
    setting = settings("ci")[0]
    lab = Lab("batching", None, "ci", "cpu", None, None)
    lab.setting = setting
    res = exp.run_setting(lab, setting)
    from dataclasses import asdict
    sr = asdict(res)
    trace = lab.last_events
    steps = [e for e in trace if e["type"] == "schedule.step"]
    occ, waste = occupancy([sr], SLOTS)["data"]
    assert occ["y"] == [len(e["batch"]) for e in steps]
    idle = [min(SLOTS - len(e["batch"]), e["waiting"]) for e in steps]
    assert waste["customdata"] == idle and sum(idle) == sr["metrics"]["idle_slot_steps_while_waiting"] > 0
    tokens = Counter(e["request_id"] for e in trace if e["type"] == "token")
    fig = gantt(sr)
    decode = next(t for t in fig["data"] if t["name"] == "decode")
    per_row = Counter()
    for row, (where, end, n) in zip(decode["y"], decode["customdata"]):
        per_row[row.split(" · ")[1]] += int(n.split()[0])
    for r in sr["per_request"]:  # one token from the prefill, one per decode step after it
        assert per_row[r["request_id"]] == tokens[r["request_id"]] - 1
        assert r["output_tokens"] == tokens[r["request_id"]]


def test_cancel_stops_between_steps_and_frees_the_engine(monkeypatch):
    import app.lab.runner as runner
    freed, kept = [], []
    real_free = runner.free

    def spy(engine):
        freed.append(engine.load())
        kept.append(weakref.ref(engine))
        real_free(engine)

    monkeypatch.setattr(runner, "free", spy)
    calls = []
    out = run("batching", size="ci", progress=calls.append, cancelled=lambda: len(calls) > 5)
    assert out.cancelled and len(out.settings) == 0 and out.sentences == []
    assert len(freed) == 1 and freed[0].running == 0 and freed[0].waiting == 0
    assert len(calls) == 6  # stopped at the first check after the sixth report
    gc.collect()
    # the experiment's own engine is gone (other test modules' fixtures may hold engines of theirs)
    assert len(kept) == 1 and kept[0]() is None


def test_html_export_is_self_contained_and_escaped(result):
    page = to_html(result)
    assert "cdn" not in page.lower().split("<script>", 2)[1][:200]
    assert "Plotly.newPlot" in page and "<script src" not in page
    assert "plotly.js v" in page or "plotly" in page[:5000000]
    for sentence in result["sentences"]:
        assert sentence.replace("&", "&amp;").replace("'", "&#x27;") in page


def test_every_setting_carries_its_repeats_and_their_spread(result):
    n = REPEATS["ci"]
    assert result["repeats"] == n >= 3
    for s in result["settings"]:
        assert len(s["repeats"]) == n
        for key in ("makespan_s", "cpu_s", "steps"):
            sp = s["spread"][key]
            assert sp["values"] == [r[key] for r in s["repeats"]] and sp["n"] == n
            assert sp["min"] <= sp["median"] <= sp["max"] and sp["median"] == s["metrics"][key]
        assert s["spread"]["makespan_s"]["median"] == statistics.median(s["spread"]["makespan_s"]["values"])
        assert s["spread"]["cpu_s"]["min"] > 0
        # counts are exact: every repeat ran the same steps
        assert s["spread"]["steps"]["min"] == s["spread"]["steps"]["max"]
        assert [r["output_tokens"] for r in s["per_request"]] == LENGTHS["ci"]


def test_the_bars_draw_each_repeat_range_as_error_bars(result):
    fig = figures(result)[0]
    assert "median of" in fig["layout"]["title"]["text"]
    for trace, s in zip(fig["data"], result["settings"]):
        sp = s["spread"]["cpu_s"]
        err = trace["error_y"]
        assert err["visible"] and not err["symmetric"]
        assert err["array"][0] == pytest.approx(sp["max"] - sp["median"])
        assert err["arrayminus"][0] == pytest.approx(sp["median"] - sp["min"])
    assert any(e > 0 for t in fig["data"] for e in t["error_y"]["array"])  # timings do spread


def test_the_sentences_lead_with_the_counted_steps_and_judge_the_time_by_the_spread(result):
    by = {s["setting"]["name"]: s for s in result["settings"]}
    said = result["sentences"][0]
    st, co = by["static-together"], by["continuous-together"]
    assert said.index(f"{co['metrics']['steps']} engine steps against static's {st['metrics']['steps']}") < \
        said.index("CPU time")
    c = compare(co, st, "cpu_s")
    if c.decided:
        assert f"of static's CPU time (range {c.low:.0%}–{c.high:.0%} over {c.n} repeats)" in said
    else:
        assert "difference in CPU time is within the spread" in said
