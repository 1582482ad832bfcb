"""The trace of a disaggregated request: one kv.transfer, both engines' steps on their own
tracks, the prefill side's captures and first draw, the decode side's tokens; the Perfetto
export's tracks and the page's panel drawn from it."""
from __future__ import annotations

import math

import pytest

from engine import LLM, SamplingParams, TokenOutput, TraceEvent
from visualizers.disagg import disagg_html, transfer_summary
from visualizers.perfetto import perfetto_trace
from visualizers.timeline import timeline_steps

PROMPT = list(range(5, 40))  # 35 tokens: 9 blocks of 4
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2)


def _run(llm: LLM) -> tuple[list[dict], list[TokenOutput]]:
    items = list(llm.stream(PROMPT, PARAMS, trace="full"))
    events = [x.to_dict() for x in items if isinstance(x, TraceEvent)]
    return events, [x for x in items if isinstance(x, TokenOutput)]


@pytest.mark.slow  # a prefill process
def test_a_disaggregated_request_is_traced_on_both_engines(checkpoint):
    path = checkpoint("llama")
    one_events, one_tokens = _run(LLM(path, device="cpu", dtype="float32", block_size=4))
    with LLM(path, device="cpu", dtype="float32", block_size=4, disaggregate=True) as llm:
        events, tokens = _run(llm)
        cfg = llm.engine.model_config
        assert llm.engine.describe().kv_pool.prefix_caching  # the prefill side's cache (the decode side has none)
    assert [t.token_id for t in tokens] == [t.token_id for t in one_tokens]
    assert tokens[0].logprobs.logprob == pytest.approx(one_tokens[0].logprobs.logprob, abs=1e-5)  # drawn there
    rid = tokens[0].request_id

    (x,) = [e for e in events if e["type"] == "kv.transfer"]
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4  # K and V, float32
    assert x["request_id"] == rid and x["tokens"] == 35 and x["num_blocks"] == math.ceil(35 / 4) == 9
    assert x["bytes"] == 9 * 4 * per_token and x["bytes_per_token"] == per_token
    assert x["layers"] == list(range(cfg.num_layers)) and x["backend"] == "gloo"
    assert len(x["src_blocks"]) == len(x["dst_blocks"]) == 9
    assert x["wire_ms"] > 0 and x["queue_ms"] >= 0 and x["prefill_ms"] > 0
    assert x["handover_ms"] >= x["wire_ms"]
    assert x["src_pool"]["free"] == x["src_pool"]["num_blocks"]  # sent, then freed there (8 full ones cached)
    assert x["src_pool"]["cached"] == 8

    steps = [e for e in events if e["type"] == "schedule.step"]
    prefill = [s for s in steps if s["engine"] == "prefill"]
    decode = [s for s in steps if s["engine"] == "decode"]
    assert len(prefill) == 1 and prefill[0]["batch"][0]["kind"] == "prefill"
    assert len(decode) == PARAMS.max_tokens - 1 and all(s["batch"][0]["kind"] == "decode" for s in decode)
    assert prefill[0]["ts"] <= x["ts"] <= decode[0]["ts"]  # the prefill's own clock, kept when forwarded
    samples = [e for e in events if e["type"] == "sample"]
    assert [s["engine"] for s in samples] == ["prefill"] + ["decode"] * (PARAMS.max_tokens - 1)
    assert {e["engine"] for e in events if e["type"] == "attention"} == {"prefill", "decode"}
    toks = [e for e in events if e["type"] == "token"]
    assert [t["index"] for t in toks] == list(range(PARAMS.max_tokens)) and {t["engine"] for t in toks} == {"decode"}
    assert [e["type"] for e in events].count("request.arrive") == 1 and [e["type"] for e in events].count("finish") == 1
    fin = next(e for e in events if e["type"] == "finish")
    assert fin["ttft_split"]["kv_transfer"] > 0
    assert [s["kind"] for s in timeline_steps(events, rid)] == ["prefill"] + ["decode"] * (PARAMS.max_tokens - 1)

    trace = perfetto_trace(events, rid, "tiny")
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"prefill 0 engine steps", "decode 0 engine steps", "KV transfer (prefill 0 -> decode 0)"} <= names
    tids = {e["tid"] for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "engine"}
    assert len(tids) == 2  # one track an engine
    sends = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "transfer"]
    assert [s["name"].split(" ")[0] for s in sends] == ["waiting", "send"]
    assert sends[1]["args"]["bytes"] == x["bytes"]
    # a colocated request's export keeps its one track
    one_rid = one_tokens[0].request_id
    one = perfetto_trace(one_events, one_rid)
    assert "engine steps" in {e["args"]["name"] for e in one["traceEvents"] if e.get("name") == "thread_name"}

    html = disagg_html([x, fin])
    s = transfer_summary(x, fin["ttft"])
    assert "9 blocks" in html and "prefill engine 0&#x27;s pool" in html and "decode engine 0&#x27;s pool" in html
    assert x["src"] == "prefill 0" and x["dst"] == "decode 0"
    assert "fewest prefill tokens" not in html  # one engine a side: no words on how it was picked
    assert 0 < s["share_of_ttft"] < 1 and f"{s['share_of_ttft']:.0%}" in html


def test_the_panel_escapes_what_it_prints_and_says_when_a_request_ran_on_one_engine():
    from visualizers.disagg import disagg_panel_html

    assert "ran on one engine" in disagg_panel_html([{"type": "finish", "ttft": 0.1}])
    x = {"type": "kv.transfer", "num_blocks": 3, "tokens": 40, "bytes": 3 * 16 * 2048, "layers": [0, 1],
         "backend": "<script>x</script>", "wire_ms": 0.5, "queue_ms": 2.0, "prefill_ms": 20.0, "handover_ms": 3.0,
         "src_blocks": [0, 1, 2], "dst_blocks": [5, 6, 700], "src_pool": {"num_blocks": 1024, "free": 1024},
         "dst_pool": {"num_blocks": 1024, "free": 1000, "cached": 0}}
    html = disagg_panel_html([x, {"type": "finish", "ttft": 0.030}])
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "10%" in html  # 3 ms of a 30 ms TTFT
    assert "a cell: 8 blocks" in html and html.count('fill="#466ec8"') == 1 + 2  # blocks 0-2: one cell; 5, 6 / 700
