"""The routing experiment on the embedded model at size ci: prefix-aware routing computes
fewer prefill tokens than round-robin (the directions are fixed in engine steps and tokens:
arrivals at fixed ticks, replicas stepped in lock step), the router's view of each cache is
what the engine then served, and the figures draw what the trace says."""
from __future__ import annotations

import pytest

from app.lab import run
from app.lab.export import to_html
from app.lab.routing import workload
from tests.app.lab.english_left import english_words, left_in_chinese
from visualizers.lab_routing import figures, sentences, spread

pytestmark = pytest.mark.slow  # three settings of two engines each


@pytest.fixture(scope="module")
def result():
    return run("routing", size="ci", repeats=1).to_json()  # counts: one run says them


def by_name(result):
    return {s["setting"]["name"]: s for s in result["settings"]}


def test_prefix_aware_computes_fewer_prefill_tokens_than_round_robin(result):
    s = by_name(result)
    rr, ll, pa = (s[n]["metrics"] for n in ("round-robin", "least-loaded", "prefix-aware"))
    assert pa["prefill_tokens"] < rr["prefill_tokens"] and pa["prefill_tokens"] < ll["prefill_tokens"]
    assert pa["hit_rate"] > rr["hit_rate"]
    # the same work under every router: the same prompts, every request to its end
    for m in (rr, ll, pa):
        assert m["prompt_tokens"] == rr["prompt_tokens"] and m["requests"] == 12
        assert m["prefill_tokens"] + m["cached_tokens"] == m["prompt_tokens"]  # prefill is what the cache did not hold
    lengths = [n for _, _, n in workload(s["round-robin"]["setting"]["options"])]
    assert len(set(lengths)) > 1
    for st in s.values():
        assert [r["output_tokens"] for r in st["per_request"]] == lengths
    # least-loaded reads the loads, which the answers' lengths make uneven: it is not round-robin
    assert [r["replica"] for r in s["least-loaded"]["extra"]["routes"]] != [i % 2 for i in range(12)]
    # why: round-robin computes every system prompt on both replicas, prefix-aware on one
    assert spread(s["round-robin"]) == 2.0 and spread(s["prefix-aware"]) == 1.0


def test_the_routes_are_the_policies_and_the_caches_served_what_the_router_saw(result):
    s = by_name(result)
    assert [r["replica"] for r in s["round-robin"]["extra"]["routes"]] == [i % 2 for i in range(12)]
    pa = s["prefix-aware"]
    cached = {r["request_id"]: r["cached_tokens"] for r in pa["per_request"]}
    for route in pa["extra"]["routes"]:
        assert route["policy"] == "prefix-aware" and len(route["cached"]) == 2
        assert cached[route["request_id"]] >= route["cached"][route["replica"]]  # the engine's own answer, kept
        if max(route["cached"]):
            assert route["cached"][route["replica"]] == max(route["cached"])
    # the first request of each system prompt is a miss everywhere; every later one is a hit
    first_seen: set[int] = set()
    for rid, k in pa["extra"]["system_of"].items():
        assert (cached[rid] > 0) == (k in first_seen), rid
        first_seen.add(k)
    assert len(workload(pa["setting"]["options"])) == 12


def test_figures_and_sentences_come_from_the_measurement(result):
    s = by_name(result)
    figs = figures(result)
    assert len(figs) == 4
    prefill = figs[0]["data"]
    assert [t["name"] for t in prefill] == ["round-robin", "least-loaded", "prefix-aware"]
    assert [t["y"][0] for t in prefill] == [s[n]["metrics"]["prefill_tokens"] for n in
                                            ("round-robin", "least-loaded", "prefix-aware")]
    # the prefill counted is the steps' prefill parts, step by step (schedule.step events)
    for st in s.values():
        assert st["metrics"]["prefill_tokens"] == sum(b["num_tokens"] for step in st["steps"] for b in step["batch"]
                                                      if b["kind"] == "prefill")
        assert sum(st["extra"]["replica_prefill"]) == st["metrics"]["prefill_tokens"]
    # the map: a filled mark for each hit, a hollow one for each miss, on the replica that ran it
    marks = [sym for t in figs[3]["data"] for sym in t["marker"]["symbol"]]
    hits = sum(1 for st in s.values() for r in st["per_request"] if r["cached_tokens"])
    assert marks.count("circle") == hits and len(marks) == 36
    text = " ".join(sentences(result))
    m_pa, m_rr = s["prefix-aware"]["metrics"], s["round-robin"]["metrics"]
    assert f"{m_pa['prefill_tokens']:,} prefill tokens against {m_rr['prefill_tokens']:,}" in text
    assert result["sentences"] == sentences(result)
    page = to_html(result)
    assert "Plotly.newPlot" in page and "cdn.plot.ly/plotly" not in page.split("<script>")[0]


def test_cancelling_stops_between_steps_and_keeps_what_finished():
    seen = []

    def cancelled() -> bool:
        return len(seen) > 0 and seen[-1].setting_index >= 1

    out = run("routing", size="ci", progress=seen.append, cancelled=cancelled)
    assert out.cancelled and [s.setting.name for s in out.settings] == ["round-robin"]
    assert out.sentences == []


def test_the_result_drawn_in_chinese_leaves_no_english(result):
    # the router's own reasons (hover text of the map) are the engine's words, as an API's are
    reasons = {w for s in result["settings"] for r in s["extra"]["routes"] for w in english_words(r["reason"])}
    assert not left_in_chinese(result, reasons), left_in_chinese(result, reasons)
