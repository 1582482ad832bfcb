"""Defects seen in the screenshots of session 13 (benchmarks/screenshot.py --states on SmolLM2 and
Gemma 3), each pinned by the words or markup that were wrong on screen. The picture each came
from is named in its test's docstring (S: SmolLM2, G: Gemma 3; width, state)."""
from __future__ import annotations

import re

from app.page.stages import stage_html
from tests.trace_views import LABELS, MODEL, events, never_ran, view
from visualizers.answer import answer_html
from visualizers.journey import journey
from visualizers.prefix_cache import prefix_cache_html
from visualizers.sampling import sampling_html
from visualizers.timeline import timeline_html


def _said(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))


def test_one_full_prompt_block_is_singular():
    """S 1400 finished: "blocks reused: 0 of 1 full prompt blocks of 16 tokens each"."""
    look = {"hit": False, "prompt_tokens": 27, "cached_tokens": 0, "cached_blocks": [], "full_blocks": 1}
    said = _said(prefix_cache_html(look, 16))
    assert "0 of 1 full prompt block of 16 tokens" in said and "blocks of 16 tokens each" not in said, said
    said = _said(prefix_cache_html({**look, "full_blocks": 2}, 16))
    assert "0 of 2 full prompt blocks of 16 tokens each" in said, said
    # G 1400 basic, a 5-token prompt: "blocks reused: 0 of 0 full prompt blocks of 16 tokens each"
    said = _said(prefix_cache_html({**look, "prompt_tokens": 5, "full_blocks": 0}, 16))
    assert "0 of 0" not in said and "the prompt fills no full block of 16 tokens" in said, said


def _tokens(texts: list[str]) -> list[dict]:
    return [{"index": i, "token_id": 40 + i if t else 2, "text": t, "t": 0.1 * (i + 1), "latency": 0.1}
            for i, t in enumerate(texts)]


def test_the_end_of_turn_token_is_named_in_the_answer_not_a_bare_dot():
    """S 1400 finished / off: the answer's last chip (<|im_end|>, no text of its own) read "·"."""
    usage = {"prompt_tokens": 5, "completion_tokens": 3, "cached_tokens": 0}
    html = answer_html(_tokens(["Paris", ".", ""]), {"reason": "stop", "usage": usage})
    chips = re.findall(r'<span class="tt-chip tt-timed".*?</span>(.*?)</span>', html)
    assert chips[-1] == "<i class='tt-notext'>(end of turn, id 2)</i>", chips
    # a textless piece that is not the end (a byte of a character not yet complete) is not called the end
    html = answer_html(_tokens(["", "é"]), None)
    assert "(no text, id 2)" in html and "end of turn" not in html


def _steps(kinds: list[str]) -> list[dict]:
    evs = [{"type": "request.arrive", "ts": 0.0, "request_id": "r"}]
    for i, kind in enumerate(kinds, 1):
        evs.append({"type": "schedule.step", "step": i, "ts": 0.1 * i, "forward_seconds": 0.05, "num_tokens": 1,
                    "batch": [{"request_id": "r", "kind": kind, "num_tokens": 1}]})
    return evs


def test_the_timeline_says_its_table_lists_the_newest_steps_only():
    """S 1400 basic: 16 engine steps, the table listed steps 9-16 and said nothing of 1-8."""
    said = _said(timeline_html(_steps(["prefill"] + ["decode"] * 15), "r"))
    assert "the table lists the newest 8 of these 16 steps" in said, said
    assert "newest 8" not in _said(timeline_html(_steps(["prefill"] + ["decode"] * 7), "r"))


def test_a_request_with_no_draft_has_decode_steps_not_decode_or_verify():
    """S 1400 finished: "7 decode/verify" (timeline) and "7 decode or verify steps" (stage 6) for a
    model with no draft, whose steps are decode steps only."""
    said = _said(timeline_html(_steps(["prefill"] + ["decode"] * 7), "r"))
    assert "8 engine steps: 1 prefill chunk, 7 decode ·" in said and "verify" not in said.split("·")[0], said
    said = _said(timeline_html(_steps(["prefill", "verify", "decode"]), "r"))
    assert "1 prefill chunk, 1 decode, 1 verify" in said, said
    text = _said(next(s for s in journey(MODEL, "r", None, _steps(["prefill", "decode", "decode"]), [])
                      if s.key == "timeline").text)
    assert "then 2 decode steps produced" in text and "or verify" not in text, text
    text = _said(next(s for s in journey(MODEL, "r", None, _steps(["prefill", "verify", "decode"]), [])
                      if s.key == "timeline").text)
    assert "then 1 decode and 1 verify step produced" in text, text


def test_sampling_without_a_draft_speaks_of_no_target():
    """S 1400 finished: "drawn from the target's final distribution", "every token (p under the
    target)" on a model with no draft model."""
    samples = [e for e in events() if e["type"] == "sample"]
    for e in samples:
        e["params"] = {"temperature": 0.8, "top_k": 0, "top_p": 0.95, "min_p": 0.0}
    said = _said(sampling_html(samples, dict(enumerate(LABELS)), vocab_size=50))
    assert "target" not in said and "drawn from the final distribution" in said, said
    samples[-1] = {**samples[-1], "source": "draft", "method": "draft"}  # a draft did propose: the words stay
    assert "p under the target" in _said(sampling_html(samples, dict(enumerate(LABELS)), vocab_size=50))


def test_a_narrow_screen_hides_the_sampling_columns_of_knobs_that_are_off():
    """S 420 replay, G 420 basic: six columns in 250 px broke the tokens mid-word ("␣Fra|nce",
    "␣Portu|gal"); the columns of knobs that are off repeat the one before them."""
    samples = [e for e in events() if e["type"] == "sample"]
    ev = samples[-1]
    ev["params"] = {"temperature": 0.8, "top_k": 0, "top_p": 0.95, "min_p": 0.0}
    ev["stages"] = {s: {"probs": [0.9, 0.1], "kept": 50} for s in ("logits", "temperature", "top_k", "top_p", "min_p")}
    html = sampling_html([ev], dict(enumerate(LABELS)), vocab_size=50)
    heads = re.findall(r"<th([^>]*)>(.*?)</th>", html)
    off = [_said(h) for attrs, h in heads if "tt-off-col" in attrs]
    assert off == ["top-k off", "min-p off"], heads
    assert html.count("<td class='tt-off-col'>") == 2 * len(ev["candidates"])
    assert "tt-narrow-only" in html and "(top-k, min-p) are hidden" in _said(html)


def test_a_request_that_never_ran_lights_only_the_stages_it_passed():
    """S 1400 stop: stopped before its first step, the map lit Prefix cache, Embed ("33 × 576"),
    Layers, Prefill, KV ("none"), LM head, Sample and Stream ("0 tokens") while their sections said
    "Never reached"; Embed said it "was traced without tensors" (it was traced at full), Layers that
    the matrix "now passes" the layers, the lens "capture level full records one per generated token"
    (at level full), and the headings promised "not reached yet"."""
    from app.page.controller import stages_of
    st = {s.key: s for s in stages_of(never_ran(special=0))}
    assert [k for k, s in st.items() if s.reached and not s.skipped] == ["request", "tokens"], \
        [(k, s.reached) for k, s in st.items()]
    for key in ("prefix", "embedding", "layers", "timeline", "kv", "logit_lens", "sampling", "answer", "batching"):
        text = _said(st[key].text)
        assert "Never reached" in text, (key, text)
        head = stage_html(st[key])  # stopped: the badge says so (L's 'stopped before this stage')
        assert "stopped before this stage" in head and "not reached yet" not in head, key
    for key, wrong in (("embedding", "traced without tensors"), ("layers", "now passes"),
                       ("logit_lens", "has no logit lens"), ("answer", "the moment it existed: 0 tokens")):
        assert wrong not in _said(st[key].text), (key, st[key].text)


def test_a_timeline_with_no_step_says_so_instead_of_an_empty_table():
    """S 1400 stop, watch: "0 engine steps: 0 prefill chunks, 0 decode/verify" over a table with a
    header and no rows."""
    arrive = [{"type": "request.arrive", "ts": 0.0, "request_id": "r"}]
    said = _said(timeline_html(arrive + [{"type": "finish", "ts": 0.2, "reason": "abort"}], "r"))
    assert "<table" not in timeline_html(arrive, "r")
    assert "no engine step has run this request: it ended before the scheduler admitted it" in said, said
    assert "no engine step has run this request yet" in _said(timeline_html(arrive, "r"))


def test_attention_names_no_verify_rows_for_a_request_no_draft_proposed_for():
    """S 1400 finished / stop: "rows drawn: 33 prefill, 4 decode, 0 verify · row edge: prefill decode
    verify" on a model with no draft."""
    said = _said(view().render("attention"))
    assert "rows drawn: 4 prefill, 2 decode ·" in said and "verify" not in said, said
