"""Chunked prefill on the embedded model at size ci: chunking bounds the tokens any step
prefills, and the figures and sentences carry the trace's numbers."""
import math

import pytest

from app.lab import run
from tests.app.lab.lab_utils import run_one
from tests.app.lab.english_left import left_in_chinese
from visualizers.lab_chunked import prefill_per_step
from visualizers.lab_verdict import seconds


@pytest.fixture(scope="module")
def result():
    return run("chunked_prefill", size="ci", repeats=1).to_json()  # counts: one run says them


def test_chunking_bounds_the_tokens_any_step_prefills(result):
    by = {s["setting"]["name"]: s["metrics"] for s in result["settings"]}
    n = by["off"]["long_prompt_tokens"]
    assert n >= 500
    assert by["off"]["max_prefill_tokens_per_step"] == n and by["off"]["long_prefill_steps"] == 1
    for chunk in (512, 128):
        m = by[str(chunk)]
        assert m["long_prompt_tokens"] == n
        assert m["max_prefill_tokens_per_step"] <= chunk
        assert m["max_step_tokens_with_streams"] <= chunk < by["off"]["max_step_tokens_with_streams"]
        assert m["long_prefill_steps"] >= math.ceil(n / chunk)


def test_the_streams_decode_while_the_long_prompt_is_prefilled_in_chunks(result):
    s = next(s for s in result["settings"] if s["setting"]["name"] == "128")
    long = next(r for r in s["per_request"] if r["role"] == "long prompt")
    shared = [st for st in s["steps"]
              if any(b["request_id"] == long["request_id"] and b["kind"] == "prefill" for b in st["batch"])]
    # every chunk's step also decoded the 4 streams (they were mid-answer when the prompt arrived)
    assert all(sum(b["kind"] == "decode" for b in st["batch"]) == 4 for st in shared)


def test_sentences_quote_the_measured_numbers(result):
    off = next(s for s in result["settings"] if s["setting"]["name"] == "off")["metrics"]
    assert len(result["sentences"]) == 3
    assert f"{off['long_prompt_tokens']}-token prompt" in result["sentences"][0]
    assert f"longest stall was {seconds(off['longest_stall_s'])}" in result["sentences"][0]  # one run: its value
    assert f"one step of {off['max_prefill_tokens_per_step']:,} tokens" in result["sentences"][0]  # counted first


def test_prefill_figure_against_the_trace():
    s, trace = run_one("chunked_prefill", "128")
    steps = [e for e in trace if e["type"] == "schedule.step"]
    fig = prefill_per_step([s])
    assert fig["data"][0]["y"] == [sum(b["num_tokens"] for b in e["batch"] if b["kind"] == "prefill") for e in steps]
    assert max(fig["data"][0]["y"]) <= 128


def test_the_result_drawn_in_chinese_leaves_no_english(result):
    assert not left_in_chinese(result), left_in_chinese(result)
