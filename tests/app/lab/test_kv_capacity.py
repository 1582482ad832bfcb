"""KV capacity on the embedded model at size ci: a too-small pool preempts, the preempted
request recomputes, and the figures' marks are the trace's preemptions."""
import pytest

from app.lab import run
from tests.app.lab.lab_utils import run_one
from tests.app.lab.english_left import left_in_chinese
from visualizers.lab_kv import with_preemptions


@pytest.fixture(scope="module")
def result():
    return run("kv_capacity", size="ci", repeats=1).to_json()  # counts: one run says them


def test_a_too_small_pool_preempts_and_recomputes(result):
    by = {s["setting"]["name"]: s for s in result["settings"]}
    small, ample = by["small"], by["ample"]
    assert ample["metrics"]["preemptions"] == 0 and ample["metrics"]["recomputed_tokens"] == 0
    assert small["metrics"]["preemptions"] >= 1 and small["metrics"]["recomputed_tokens"] > 0
    assert small["metrics"]["steps"] > ample["metrics"]["steps"]
    for s in (small, ample):  # every request still made all its tokens
        assert all(r["output_tokens"] == s["setting"]["options"]["output_tokens"] for r in s["per_request"])
    lost = {e["request_id"] for e in small["events"]}
    assert all(next(r for r in small["per_request"] if r["request_id"] == rid)["preemptions"] >= 1 for rid in lost)
    assert "preempted" in result["sentences"][0]


def test_preemption_marks_and_recompute_against_the_trace():
    s, trace = run_one("kv_capacity", "small")
    preempts = [e for e in trace if e["type"] == "schedule.preempt"]
    assert preempts
    marks = next(t for t in with_preemptions(s)["data"] if t["name"] == "preempted")
    assert [c[0] for c in marks["customdata"]] == [e["step"] for e in preempts]
    computed = {}
    for e in trace:
        if e["type"] == "schedule.step":
            for b in e["batch"]:
                computed[b["request_id"]] = computed.get(b["request_id"], 0) + b["num_tokens"]
    for r in s["per_request"]:
        extra = computed[r["request_id"]] - (r["prompt_tokens"] + r["output_tokens"] - 1)
        assert s["metrics"]["recomputed_by_request"][r["request_id"]] == extra
        assert (extra > 0) == (r["preemptions"] > 0)


def test_the_result_drawn_in_chinese_leaves_no_english(result):
    assert not left_in_chinese(result), left_in_chinese(result)
