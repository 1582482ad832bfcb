"""Issue 25, item 7 (the last session's closing note): a request stopped before any engine step
ran it kept a "not reached yet" badge on the Batching stage, and its stages before the stream
were lit as passed (the end of its stream counted as a stream that had passed them); the
Sampling panel said "no token sampled yet" of a request that had ended. The map and the stages
say it was stopped before each stage it never reached. tests/app/page/test_live_browser.py
checks the same on screen, with a request that really waited."""
from __future__ import annotations

from app.page.controller import stages_of
from app.page.live_view import LiveView
from app.page.stages import map_html, stage_html
from tests.visualizers.test_selection import LABELS, MODEL, PROMPT, events
from visualizers.kv_cache import empty_pool

NEVER = ("embedding", "layers", "timeline", "kv", "logit_lens", "sampling", "batching")  # an engine step's stages


def view_of(items: list[dict]) -> LiveView:
    v = LiveView(model=MODEL, piece=lambda i: LABELS[i] if i < len(LABELS) else f"<{i}>", is_special=lambda i: i == 6)
    v.request_id = "r1"
    v.set_pool(empty_pool(8, 2))
    v.add(items)
    return v


def stopped_while_waiting() -> LiveView:
    usage = {"prompt_tokens": PROMPT, "completion_tokens": 0, "cached_tokens": 0}
    return view_of([{"type": "request.arrive", "step": 0, "trace_level": "full", "messages": []}, events()[0],
                    {"type": "finish", "step": 1, "reason": "abort", "usage": usage},
                    {"type": "output", "token_id": -1, "text": "", "finished": True, "finish_reason": "abort",
                     "index": 0, "t": 0.0, "step": 1, "usage": usage}])


def test_the_stages_a_stopped_request_never_reached_say_so():
    st = {s.key: s for s in stages_of(stopped_while_waiting())}
    for key in NEVER:
        s = st[key]
        assert not s.reached and s.stopped and s.chip == "stopped before", (key, s)
        head = stage_html(s)
        assert "stopped before this stage" in head and "not reached yet" not in head, (key, head)
    assert st["request"].reached and st["tokens"].reached and not st["tokens"].stopped  # it arrived and was tokenized
    assert "tt-map-lit" not in map_html([st["embedding"]])  # not lit as passed
    assert "stopped before" in map_html(list(st.values()))


def test_its_panels_say_it_ended_before_any_step_not_yet():
    v = stopped_while_waiting()
    for name in ("sampling", "embedding", "attention", "moe", "logit_lens"):
        html = v.render(name)
        assert "yet" not in html and "never reached: the request ended (abort) before any engine step" in html, \
            (name, html)


def test_a_finished_request_has_no_stage_stopped_before():
    evs = events()
    gen = [{"type": "output", "token_id": t, "text": LABELS[t], "finished": t == 6, "index": t - PROMPT, "t": 0.1,
            "step": t - PROMPT + 1, "finish_reason": "stop" if t == 6 else None,
            "usage": {"prompt_tokens": PROMPT, "completion_tokens": 3}} for t in (4, 5, 6)]
    st = stages_of(view_of([{"type": "request.arrive", "step": 0, "trace_level": "full", "messages": []}] + evs
                           + gen))
    assert not any(s.stopped for s in st), [s.key for s in st if s.stopped]
