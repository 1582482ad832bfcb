"""The journey's words follow what is known at that moment (issue 25's gaps): a request that
cannot speculate skips the Speculation stage from its start, and the KV stage's sentence
matches the replay position (before the finish: the blocks are still held)."""
from __future__ import annotations

from tests.trace_views import LABELS, MODEL, PROMPT, events
from visualizers.journey import journey
from visualizers.stages.speculation import without

OUTPUTS = [{"type": "output", "token_id": i, "text": LABELS[i], "finished": False, "index": i - PROMPT, "t": 0.0}
           for i in range(PROMPT, len(LABELS))]
STEPS = [{"type": "schedule.step", "step": s, "batch": [{"request_id": "r1", "kind": k}]}
         for s, k in ((1, "prefill"), (2, "decode"), (3, "decode"))]
FINISH = {"type": "finish", "step": 3, "reason": "stop", "usage": {"prompt_tokens": 4, "completion_tokens": 3}}


def stage(key: str, model: dict, body: dict | None, evs: list[dict], outputs: list[dict] = ()):
    return next(s for s in journey(model, "r1", body, evs, list(outputs)) if s.key == key)


def test_a_model_without_a_draft_skips_speculation_from_the_first_update():
    st = stage("spec", MODEL, {"messages": []}, [])  # nothing ran yet
    assert st.skipped and "served without a draft" in st.text and "runs without" in st.text
    mid = stage("spec", MODEL, None, events()[:3] + STEPS[:1])  # mid-stream, before any finish
    assert mid.skipped


def test_a_request_that_turned_speculation_off_or_adjusts_its_logits_skips_it_from_the_start():
    drafted = {**MODEL, "has_draft": True}
    off = stage("spec", drafted, {"speculative": {"enabled": False, "num_tokens": 2}}, [])
    assert off.skipped and "turned off for this request" in off.text
    for body in ({"presence_penalty": 0.5}, {"repetition_penalty": 1.3}, {"response_format": {"type": "json_object"}},
                 {"logit_bias": {"5": 3}}, {"min_tokens": 4}):
        assert stage("spec", drafted, body, []).skipped, body
        assert "one token a step" in without(drafted, body)
    # a drafted model with nothing against it may still speculate: not skipped before the end
    may = stage("spec", drafted, {"speculative": {"enabled": True}, "repetition_penalty": 1.0}, STEPS[:1])
    assert not may.skipped and without(drafted, {"repetition_penalty": 1.0}) is None
    done = stage("spec", drafted, {}, events() + STEPS + [FINISH], OUTPUTS)
    assert done.skipped and "ran without" in done.text  # it ended with no round: skipped then


def test_the_kv_sentence_says_handed_back_only_once_the_request_has_finished():
    before = stage("kv", MODEL, None, events() + STEPS, OUTPUTS)  # a replay cursor before the finish
    assert "handed back the moment it finished" not in before.text
    assert "go back to the pool the moment it finishes" in before.text
    after = stage("kv", MODEL, None, events() + STEPS + [FINISH], OUTPUTS)
    assert "handed back the moment it finished" in after.text


def test_the_sample_stage_names_the_stages_before_temperature_with_their_numbers():
    evs = events()
    sample = next(e for e in reversed(evs) if e["type"] == "sample")
    sample["stages"] = {"logits": {"probs": [0.9, 0.1], "kept": 50},
                        "grammar": {"probs": [1.0, 0.0], "kept": 3, "moved": 47, "changes": [[40, None]]},
                        "presence_penalty": {"probs": [1.0, 0.0], "kept": 3, "moved": 2, "changes": [[4, -1.0]]}}
    sample["params"] = {**sample["params"], "structured": "json_object", "presence_penalty": 1.0}
    st = stage("sampling", MODEL, None, evs + STEPS, OUTPUTS)
    assert "the grammar mask allowed <b>3</b> of the <b>50</b> tokens" in st.text
    assert "the presence penalty moved <b>2</b> logits" in st.text
    from visualizers.sampling import sampling_html
    html = sampling_html([sample], {i: t for i, t in enumerate(LABELS)} | {40: "<x>"}, vocab_size=50)
    assert "grammar mask json object" in html and "presence penalty 1" in html  # the columns' labels
    assert "allowed 3 of 50 tokens next; removed <code>&lt;x&gt;</code>" in html  # token text escaped
    assert "<code>␣Paris</code> -1.00" in html and "data-bias-id='40'" in html


def test_before_any_request_no_stage_speaks_of_a_request_that_does_not_exist():
    """The page before its first Send: the Request stage previews what Send will post, the others
    say no request has come yet (not "still on its way", "still running", "traced without tensors")."""
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 8, "temperature": 0.5}
    stages = journey({**MODEL, "has_draft": True}, "", body, [], [])
    texts = {s.key: s.text for s in stages}
    assert texts["request"].startswith("<p>Send will post a JSON body") and "its id <b></b>" not in texts["request"]
    for key, text in texts.items():
        for wrong in ("still on its way", "Still running", "traced without tensors", "this request held",
                      "has no logit lens", "This request runs without", "0</b> tokens: a [0"):
            assert wrong not in text, (key, wrong)
    for key in ("tokens", "prefix", "timeline", "sampling", "batching", "answer"):
        assert "No request yet" in texts[key], key
    assert "bytes per token" in texts["kv"] and "rows ×" in texts["embedding"]  # the model's own numbers stay
    # once a request exists the old words come back
    assert "still on its way" in next(s for s in journey(MODEL, "r1", body, [], []) if s.key == "tokens").text


def test_one_special_token_takes_a_verb_in_the_singular():
    """Gemma 3's plain prompt has one special token (<bos>): "1 of them is a special token that marks"."""
    tok = {"type": "tokenize", "step": 0, "count": 3, "chat_template": False, "tokenizer_size": 10,
           "tokens": [{"id": 2, "text": "", "piece": "<bos>", "special": True},
                      {"id": 5, "text": "Hi", "piece": "Hi", "special": False},
                      {"id": 6, "text": " you", "piece": " you", "special": False}]}
    text = stage("tokens", MODEL, {"prompt": "Hi you"}, [tok]).text
    assert "is a special token that marks where the text begins" in text, text


def test_capture_level_off_still_skips_speculation_on_a_model_without_a_draft():
    """Gemma 3 and SmolLM2 at capture level off: the map drew Speculation as a stage of its own
    (every other level, and the skipped line, say the model has no draft)."""
    st = stage("spec", MODEL, {"trace_level": "off"}, [], OUTPUTS)
    assert st.skipped and "served without a draft" in st.text, st.text
    kept = stage("spec", {**MODEL, "has_draft": True}, {"trace_level": "off"}, [], OUTPUTS)
    assert not kept.skipped and "records no speculative rounds" in kept.text


def test_the_prefill_chip_counts_one_step_in_the_singular():
    """Gemma 3's streaming picture: the map's chip read "1 steps" before the first token's time."""
    st = stage("timeline", MODEL, None, events()[:3] + STEPS[:1])
    assert st.chip in ("1 step", "") or st.chip.startswith("TTFT"), st.chip
    assert "1 steps" not in st.chip


def test_a_request_waiting_for_its_prefill_holds_no_kv_yet():
    """SmolLM2's watch picture (streaming, 0 tokens): the KV stage said "So far this request held
    K/V for 35 tokens ... in 3 blocks" while its panel said it held 0 in 0 blocks, "block table: ·"."""
    from app.page.live_view import LiveView
    from visualizers.kv_cache import empty_pool
    st = stage("kv", MODEL, None, events()[:1])  # tokenized, not yet scheduled
    assert "held K/V" not in st.text and "Not reached yet" in st.text and not st.reached, st.text
    v = LiveView(model=MODEL, piece=str, is_special=lambda i: False)
    v.request_id = "r1"
    v.set_pool(empty_pool(8, 2))
    v.add(events()[:1])
    html = v.render("kv")
    assert "block table: no block allocated yet" in html and "block table: ·" not in html, html


def test_time_to_first_token_is_quoted_as_soon_as_the_first_token_exists():
    """S 1400 replay at step 24 of 48: stage 6 quoted only the median step; TTFT came with the
    finish, though the first token (and its time since arrival) existed from step 1."""
    first = [{**OUTPUTS[0], "t": 0.2104}]
    mid = stage("timeline", MODEL, None, events()[:3] + STEPS[:2], first)
    assert "Time to first token: <b>210.4 ms</b>" in mid.text and mid.chip == "TTFT 210.4 ms", (mid.text, mid.chip)
    before = stage("timeline", MODEL, None, events()[:3] + STEPS[:1])  # no token yet: no TTFT to quote
    assert "Time to first token" not in before.text
    done = stage("timeline", MODEL, None, events() + STEPS + [{**FINISH, "ttft": 0.25}], first)
    assert "Time to first token: <b>250.0 ms</b>" in done.text  # the engine's own, once it finished


def test_an_unlikely_draw_reads_the_same_small_probability_in_its_sentence_and_chip():
    """Issue 38 item 9: "drew «men» with probability 0.00" beside a chip "p 0.00039"."""
    evs = events()
    sample = next(e for e in reversed(evs) if e["type"] == "sample")
    for p, said in ((0.00039, "0.00039"), (0.0041, "0.0041"), (0.000004, "4e-6"), (0.72, "0.72"), (0.0, "0.00")):
        sample["token_prob"] = p
        st = stage("sampling", MODEL, None, evs + STEPS, OUTPUTS)
        assert f"with probability <b>{said}</b>;" in st.text and st.chip == f"p {said}", (p, st.text, st.chip)
