"""Issue 40 item 3: where a traced request's finish says what tracing added to its times
(trace_seconds, engine/output_processor.py), the page quotes the engine's own beside the
stream's: the answer panel, the prefill/decode stage and the timeline's TTFT line."""
from __future__ import annotations

from tests.visualizers.test_stage_words_zh import prose, stage
from tests.trace_views import events
from visualizers.answer import answer_html
from visualizers.own_times import own_times
from visualizers.timeline import summary_line

STEPS = [{"type": "schedule.step", "step": s, "batch": [{"request_id": "r1", "kind": k}], "forward_seconds": 0.002}
         for s, k in ((1, "prefill"), (2, "decode"), (3, "decode"))]
FIN = {"type": "finish", "step": 3, "reason": "length", "ttft": 0.010, "usage": {},
       "ttft_split": {"tokenize": 0.001, "queue": 0.001, "prefill": 0.007, "first_sample": 0.001},
       "token_latencies": [0.004, 0.006], "trace_seconds": {"ttft": 0.003, "token_latencies": [0.001, 0.002]}}
TOKENS = [{"index": i, "token_id": 7 + i, "text": "ab"[i:i + 1] or "c", "t": 0.010 + 0.005 * i, "latency": 0.005}
          for i in range(3)]


def test_own_times_are_the_stream_less_what_tracing_added():
    own = own_times(FIN)
    assert (round(own.ttft, 6), own.ttft_added, round(own.per_token, 6), round(own.added, 6)) == \
        (0.007, 0.003, 0.0035, 0.006)
    assert own_times({k: v for k, v in FIN.items() if k != "trace_seconds"}) is None and own_times(None) is None


def test_the_answer_quotes_the_engines_own_times():
    en, zh = answer_html(TOKENS, FIN, state="finished"), answer_html(TOKENS, FIN, state="finished", lang="zh_CN")
    assert "the engine's own: first token at 7.0 ms, then 3.5 ms per token (tracing added 6.0 ms)" in en, en
    assert "引擎本身：首个词元于 7.0 ms，之后每个词元 3.5 ms（追踪另加了 6.0 ms）" in zh, zh
    assert "the engine" not in answer_html(TOKENS, {**FIN, "trace_seconds": None}, state="finished")


def test_the_prefill_decode_stage_and_the_timeline_say_what_tracing_added():
    en = stage("en", "timeline", events() + STEPS + [FIN])
    assert "Time to first token: <b>10.0 ms</b>. The engine's own was 7.0 ms: tracing this request added 3.0 ms." \
        in en.text, en.text
    zh = stage("zh_CN", "timeline", events() + STEPS + [FIN])
    assert "其中引擎本身用了 7.0 ms：追踪这个请求另加了 3.0 ms。" in zh.text and not prose(zh.text), zh.text
    steps = [{"kind": "prefill", "others": []}, {"kind": "decode", "others": []}]
    assert "(tracing 3.0 ms of it)" in summary_line(steps, FIN, {}, None, TOKENS)
    assert "首次采样 1.0 ms (其中追踪 3.0 ms)" in summary_line(steps, FIN, {}, None, TOKENS, "zh_CN")
