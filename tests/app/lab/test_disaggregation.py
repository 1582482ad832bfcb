"""Disaggregation on the embedded model at size ci: no decode step carries a prefill token once
prefill has an engine of its own, the pages handed over are the prompts' blocks, the figures
carry the trace's numbers, and the prefill process is gone after."""
import math
import multiprocessing

import pytest
import torch

from app.lab import Lab, get
from app.lab.experiment import Result
from tests.app.lab.english_left import left_in_chinese
from visualizers.lab_disagg import engine_tracks, prefill_beside_streams, stream_steps, ttft_split


@pytest.fixture(scope="module")
def runs():
    """Both settings as run() runs them, each with the trace it was read from."""
    exp = get("disaggregation")
    threads = torch.get_num_threads()
    lab = Lab("disaggregation", None, "ci", "cpu", None, None)
    done, traces = [], {}
    for setting in exp.settings("ci"):
        lab.setting = setting
        done.append(exp.run_setting(lab, setting))
        traces[setting.name] = lab.last_events
    exp.compare(done)
    result = Result(exp.name, exp.title, "embedded", "ci", done, machine={"cpus": 2, "cuda": None})
    result = result.to_json()
    result["sentences"] = exp.sentences(result)
    return result, traces, threads


def by_name(result):
    return {s["setting"]["name"]: s for s in result["settings"]}


def test_no_decode_step_carries_prefill_once_disaggregated(runs):
    result, _, _ = runs
    co, dis = (by_name(result)[k]["metrics"] for k in ("colocated", "disaggregated"))
    chunk = result["settings"][0]["setting"]["options"]["chunk"]
    longs = co["long_prompts"] * co["long_prompt_tokens"]
    # colocated: every long prompt's chunks rode in the streams' steps, none over the budget
    assert co["prefill_tokens_beside_streams"] == longs
    assert 0 < co["max_prefill_tokens_beside_streams"] <= chunk
    assert co["stream_steps_with_prefill"] >= co["long_prompts"] * math.ceil(co["long_prompt_tokens"] / chunk)
    assert co["handovers"] == 0 and co["handover_bytes"] == 0 and co["processes"] == 1
    # disaggregated: none did; the prefill engine's steps did it all
    assert dis["prefill_tokens_beside_streams"] == 0 and dis["stream_steps_with_prefill"] == 0
    assert dis["prefill_engine_steps"] >= dis["long_prompts"] * math.ceil(dis["long_prompt_tokens"] / chunk)
    assert dis["processes"] == 2 and dis["threads_per_process"] == co["threads_per_process"]  # a step's threads
    for m in (co, dis):
        assert m["output_tokens"] == 4 * 32 + m["long_prompts"] * 4
        assert m["long_ttft_median_s"] > 0 and m["gap_p99_s"] >= m["gap_p50_s"] > 0 and m["tokens_per_s"] > 0


def test_the_long_prompts_arrive_at_the_same_point_of_the_streams_work(runs):
    result, _, _ = runs
    for s in result["settings"]:
        after = s["setting"]["options"]["arrive_after_stream_tokens"]
        streams = [r for r in s["per_request"] if r["role"] == "stream"]
        longs = [r for r in s["per_request"] if r["role"] == "long prompt"]
        for r, n in zip(longs, after):
            # the streams had emitted n tokens when it arrived (less than a step's more: a disaggregated
            # step can append a stream's first token, handed over, and decode its second)
            before = sum(t < r["arrival_s"] for q in streams for t in q["token_s"])
            assert n <= before < n + 2 * len(streams)
        if s["setting"]["name"] == "colocated":  # one token a stream a step: the arrival step is exact
            start = streams[0]["arrival_step"]  # the engine's count after its warm-up
            assert [r["arrival_step"] - start for r in longs] == [n // len(streams) for n in after]


def test_the_pages_handed_over_are_the_prompts_blocks(runs):
    result, traces, _ = runs
    dis = by_name(result)["disaggregated"]
    m = dis["metrics"]
    moved = [e for e in traces["disaggregated"] if e["type"] == "kv.transfer"]
    assert len(moved) == m["handovers"] == len(dis["per_request"])  # every request went on past its first token
    block = moved[0]["block_size"]
    prompts = {r["request_id"]: r["prompt_tokens"] for r in dis["per_request"]}
    assert all(e["num_blocks"] == math.ceil(prompts[e["request_id"]] / block) for e in moved)
    assert m["handover_blocks"] == sum(math.ceil(n / block) for n in prompts.values())
    assert m["handover_bytes"] == m["handover_blocks"] * m["bytes_per_block"] == sum(e["bytes"] for e in moved)
    assert 0 < m["handover_share_of_ttft"] < 1 and m["wire_share_of_ttft"] <= m["handover_share_of_ttft"]


def test_the_figures_carry_the_trace(runs):
    result, traces, _ = runs
    for name, trace in traces.items():
        s = by_name(result)[name]
        streams = {r["request_id"] for r in s["per_request"] if r["role"] == "stream"}
        steps = [e for e in trace if e["type"] == "schedule.step" and e.get("engine") != "prefill"
                 and any(b["request_id"] in streams and b["kind"] == "decode" for b in e["batch"])]
        fig = prefill_beside_streams([s])
        assert fig["data"][0]["y"] == [sum(b["num_tokens"] for b in e["batch"] if b["kind"] == "prefill")
                                       for e in steps]
        assert [st["step"] for st in stream_steps(s)] == [e["step"] for e in steps]
        rows = engine_tracks([s])["layout"]["yaxis"]["categoryarray"]
        prefill_side = [e for e in trace if e["type"] == "schedule.step" and e.get("engine") == "prefill"]
        assert len(rows) == (2 if prefill_side else 1)
        assert len(s["extra"]["prefill_steps"]) == len(prefill_side)
    dis = by_name(result)["disaggregated"]
    longs = [r["request_id"] for r in dis["per_request"] if r["role"] == "long prompt"]
    moved = {e["request_id"]: e for e in traces["disaggregated"] if e["type"] == "kv.transfer"}
    wire = next(t for t in ttft_split([dis])["data"] if t["name"] == "on the wire")
    assert wire["y"] == [moved[rid]["wire_ms"] / 1e3 for rid in longs]


def test_sentences_quote_the_counts_and_the_shared_cores(runs):
    result, _, _ = runs
    co, dis = (by_name(result)[k]["metrics"] for k in ("colocated", "disaggregated"))
    said = result["sentences"]
    assert f"{co['prefill_tokens_beside_streams']:,} tokens" in said[0]
    assert f"{dis['handover_blocks']} blocks × {dis['bytes_per_block']:,} B" in said[0]
    assert f"{dis['handover_share_of_ttft']:.1%}" in said[1]
    assert "2 CPU cores the two processes share the same cores" in said[2]


def test_the_prefill_process_is_stopped_and_the_threads_given_back(runs):
    _, _, threads = runs
    assert not [p for p in multiprocessing.active_children() if p.name == "tokentrace-prefill"]
    assert torch.get_num_threads() == threads


def test_a_cancelled_disaggregated_run_stops_its_prefill_process():
    """Cancelled mid-way through the disaggregated setting: its requests aborted, its prefill
    process stopped, this process's threads given back."""
    from app.lab import run
    threads, seen = torch.get_num_threads(), []

    def progress(p):
        seen.append(p)

    def cancelled():  # a few steps into the disaggregated setting (the colocated one ran whole)
        return sum(p.setting_index == 1 and p.what.startswith("step") for p in seen) >= 3

    result = run("disaggregation", size="ci", progress=progress, cancelled=cancelled, device="cpu")
    assert result.cancelled and [s.setting.name for s in result.settings] == ["colocated"]
    assert not [p for p in multiprocessing.active_children() if p.name == "tokentrace-prefill"]
    assert torch.get_num_threads() == threads


def test_the_result_drawn_in_chinese_leaves_no_english(runs):
    assert not left_in_chinese(runs[0]), left_in_chinese(runs[0])
