"""One selection (issue 25, "What must hold" 2): a click on the token at position p selects the
pass that read p and predicted p + 1, and every panel shows that one pass and says which it is.
Also the frozen headers of a truncated trace ("What must hold" 4) and the panels' wording (item 9).

Hand-made events whose right answer is known: a 4-token prompt (positions 0-3), then three
drawn tokens (4, 5, 6): the prefill pass read 0-3 and drew 4; decode passes read 4 and 5."""
from __future__ import annotations

import html as html_lib
import json
import re

import pytest

from app.page.live_view import LiveView
from tests.trace_views import LABELS, MODEL, PROMPT, events, never_ran, view


def _said(html: str) -> str:
    m = re.search(r'<div class="tt-sel-pass">selected: (.*?)</div>', html)
    return m.group(1) if m else ""


def test_a_click_selects_one_pass_and_every_panel_shows_and_names_it():
    v = view()
    v.select(4)  # " Paris": the pass that read it and predicted "."
    want = "the pass that read <code>␣Paris</code> (position 4) and predicted <code>.</code> (position 5)"
    htmls = {n: v.render(n) for n in ("embedding", "attention", "kv", "moe", "logit_lens", "sampling")}
    for name, html in htmls.items():
        assert _said(html).startswith(want), (name, _said(html))
    assert "query row: position 4 (decode" in htmls["attention"]
    assert 'tt-amap-picked" data-pos="4"' in htmls["attention"]  # the map's outlined row is position 4
    assert "row 4 (marked red at the left): token <code>␣Paris</code>, id 4" in htmls["embedding"]
    assert "into block <b>6</b>, slot 0 of 2" in htmls["kv"]  # position 4: block table entry 2, slot 0
    assert "<tr class='tt-sel-row'><th data-pos='4'>▶ 4</th>" in htmls["moe"]
    assert "position 5" in htmls["logit_lens"] and "chosen <code>.</code>" in htmls["logit_lens"]
    assert "position 5 · greedy" in htmls["sampling"] and "drawn: <code>.</code>" in htmls["sampling"]


def test_the_default_is_the_newest_pass_and_the_newest_token_was_never_read():
    v = view()
    sel = v.selection()
    assert (sel.read, sel.predicted) == (5, 6)  # read ".", predicted the newest token
    assert "position 6 · greedy" in v.render("sampling") and "query row: position 5 " in v.render("attention")
    v.select(6)  # the newest: no pass has read it
    html = v.render("attention")
    assert "is the newest token: it was drawn but never read by any pass" in html
    assert _said(html).startswith("the pass that read <code>.</code> (position 5)")
    v.select(None)
    assert "never read" not in v.render("attention")


def test_a_prompt_position_selects_a_prefill_row_that_drew_nothing():
    v = view()
    v.select(1)  # "The": read by the prefill pass, whose next token " capital" the prompt gave
    assert "nothing was drawn" in _said(v.render("embedding"))
    assert "its next token <code>␣capital</code> was the prompt's own" in v.render("sampling")
    assert "was the prompt's own" in v.render("logit_lens")
    assert "query row: position 1 (prefill" in v.render("attention")
    v.select(3)  # the prompt's last token: the prefill pass drew " Paris" from it
    assert "drawn: <code>␣Paris</code>" in v.render("sampling")


def test_select_pass_clamps_and_waits_for_the_first_token():
    from visualizers.selection import select_pass
    assert select_pass(LABELS[:PROMPT], None, PROMPT).read is None  # prefilling: no pass has drawn yet
    assert select_pass(LABELS, 99, PROMPT).read == 5 and select_pass(LABELS, -1, PROMPT).read == 5


def test_attention_labels_both_axes_marks_local_layers_and_shows_uncaptured_keys_as_a_band():
    v = view(events(k_start=2))  # decode rows kept keys 2.. only (a capture budget)
    v.select(5)
    html = v.render("attention")
    rows = re.findall(r'class="tt-amap-r[^"]*" data-pos="(\d+)" title="query position \d+: ([^"]*)"', html)
    cols = re.findall(r'class="tt-amap-c" data-pos="(\d+)" title="key position \d+: ([^"]*)"', html)
    assert [int(p) for p, _ in rows] == [2, 3, 4, 5] == [int(p) for p, _ in cols]  # from the first kept key
    assert rows[2][1].startswith("&#x27; Paris&#x27;")  # the full token on hover
    assert "… 2 earlier keys not captured" in html  # keys 0-1: a visible band, not a silent cut
    # the overview: every layer x head for query 5, grouped by KV head, the local layer marked
    assert html.count('class="tt-heat tt-ov-img"') == 1 and "KV head 0 ← query heads 0–1" in html
    assert re.search(r'title="layer 1: local, sliding window 2 tokens">L1 local<', html)
    assert "1 KV head " in html and "1 KV heads" not in html and "2 query heads share 1 KV head (2 per KV head)" in html
    specs = [json.loads(html_lib.unescape(a)) for a in re.findall(r'data-tt-hover="([^"]*)"', html)]
    cells = next(sp for sp in specs if sp.get("kind") == "cells")
    assert (cells["layers"], cells["heads"]) == ([0, 1], [0, 1])
    assert (cells["q"], cells["qname"], cells["kv"], cells["local"]) == (5, "'.'", 0, [0, 2])
    assert cells["top"][0][1][:2] == [5, 0.6] and cells["names"]["5"] == "'.'"  # head 1 holds 0.6 on its own key


def test_a_click_on_an_overview_cell_picks_that_layer_and_head():
    v = view()
    v.select_head(1, 1)
    html = v.render("attention")
    assert "layer <b>1</b> of 2 captured · query head <b>1</b>" in html
    assert "local layer: sliding window 2 tokens" in html


def test_a_truncated_trace_freezes_each_capture_panel_with_a_warning_in_its_header():
    evs = events()
    cut = [e for e in evs if not (e["step"] == 3 and e["type"] in ("attention", "moe", "embed", "logit_lens"))]
    cut.append({"type": "trace.truncated", "step": 3, "limit_bytes": 8 << 20})
    v = view(cut)
    for name, stop in (("attention", "after token <code>␣Paris</code> at position 4"),
                       ("embedding", "after token <code>␣Paris</code> at position 4"),
                       ("moe", "after token <code>␣Paris</code> at position 4"),
                       ("logit_lens", "after token <code>.</code> at position 5")):
        html = v.render(name)
        head = html.split('<div class="tt-sel-pass">')[0]  # the warning sits in the header
        assert "⚠ frozen" in head and stop in head and "(engine step 3)" in head and "8 MiB" in head, (name, head)
    assert "⚠ frozen" not in v.render("sampling")  # light events go on past the cap
    assert "⚠ frozen" not in view().render("attention")
    # the newest pass read position 5, whose attention was never captured: said, not hidden
    assert "no attention was captured for it" in v.render("attention")


@pytest.mark.parametrize("level, name, words", [("basic", "logit_lens", "the logit lens needs capture level full"),
                                                ("basic", "embedding", "embedding rows need capture level full"),
                                                ("off", "sampling", "the sampling distributions need capture")])
def test_what_a_level_leaves_out_is_said_in_grammatical_words(level, name, words):
    v = LiveView(model=MODEL, piece=str, is_special=lambda i: False, body={"trace_level": level})
    v.request_id = "r1"
    v.add([{"type": "output", "token_id": 4, "text": "x", "finished": False, "index": 0, "t": 0.0}])
    assert words in v.render(name)


def test_a_dense_model_says_it_has_no_moe_without_waiting_for_routing():
    v = view([e for e in events() if e["type"] != "moe"])
    v.model = {**MODEL, "is_moe": False}
    html = v.render("moe")
    assert "this model has no MoE layers" in html and "yet" not in html
    v.body = {"trace_level": "basic"}
    assert "this model has no MoE layers" in v.render("moe") and "not recorded" not in v.render("moe")


def test_the_lens_shows_a_no_break_space_as_a_mark_like_every_panel_not_a_python_repr():
    from visualizers.logit_lens import logit_lens_html
    ev = {"position": 5, "token_id": 7, "token_text": "\xa0", "source": "target",
          "layers": [{"top_ids": [7, 8, 9], "top_texts": ["\xa0", " ", "\u200b"], "top_probs": [0.5, 0.3, 0.2],
                      "chosen_rank": 1, "chosen_prob": 0.5}]}
    html = logit_lens_html([ev])
    cells = re.findall(r"<td class=\"tt-lens-cell[^>]*><code>(.*?)</code>", html)
    assert cells == ["⍽", "␣", "\\u200b"], cells
    assert "&#x27;\\xa0&#x27;</code>" not in html and "chosen <code>⍽</code>" in html


def test_the_lens_rank_wraps_between_its_numbers_never_inside_one():
    """At 420 px the chosen column is narrow: "#41,068 · 7.0e-55" wrapped anywhere read "#41,06" / "8 ·
    7.0e-" / "55". The rank and the probability are each unbreakable; the line breaks at the " · "."""
    from pathlib import Path as _P

    from visualizers.logit_lens import logit_lens_html
    ev = {"position": 5, "token_id": 7, "token_text": "x", "source": "target",
          "layers": [{"top_ids": [8], "top_texts": ["y"], "top_probs": [0.9], "chosen_rank": 41068,
                      "chosen_prob": 7.0e-55}]}
    cell = re.search(r'<td class="tt-lens-rank"[^>]*>(.*?)</td>', logit_lens_html([ev])).group(1)
    assert re.fullmatch(r'<span class="tt-nw">#41,068</span> · <span class="tt-nw">[^<]+e-55</span>', cell), cell
    css = (_P(__file__).parents[2] / "app" / "page" / "panels.css").read_text()
    assert ".tt-lens .tt-lens-rank .tt-nw { white-space: nowrap; }" in css
    assert "tt-lens-rank, .tt-lens th:first-child { white-space: normal; overflow-wrap: anywhere; }" not in css


def test_a_greedy_request_is_not_said_to_draw_at_random():
    from app.serving.requests import parse_body
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    checks = dict((name, detail) for name, _, detail in parse_body(body).checks)
    assert "no seed (a random draw)" not in checks["sampling"] and "greedy" in checks["sampling"]
    hot = dict((name, detail) for name, _, detail in parse_body({**body, "temperature": 0.8}).checks)
    assert "no seed (a random draw)" in hot["sampling"]


def test_a_truncated_trace_is_a_warning_in_the_request_panel_not_a_green_tick():
    v = view()
    v.validation = {"ok": True, "request_id": "r1", "checks": [("messages", True, "1 message")]}
    v.add([{"type": "trace.truncated", "step": 3, "limit_bytes": 8 << 20}])
    html = v.render("request")
    assert '<li class="tt-warn">⚠ trace: truncated: at engine step 3' in html
    assert '<li class="tt-ok">✓ trace' not in html


def test_a_frozen_header_names_the_answers_last_token_when_a_rejected_draft_was_captured_past_it():
    """A verify pass captures draft positions the answer never kept: the header named no token
    ("after token at position 75") when the newest capture was one of them."""
    from visualizers.selection import frozen_html
    head = frozen_html({"step": 4, "limit_bytes": 60000}, 9, LABELS, "attention captures")
    assert "after token <code>&lt;eos&gt;</code> at position 6" in head
    assert "after token <code>␣Paris</code> at position 4" in frozen_html({"step": 2}, 4, LABELS)
    # a byte piece of a split character (its text "") was an empty <code>: "after token at position 74"
    assert "after token <code>(no text)</code> at position 1" in frozen_html({"step": 2}, 1, ["a", ""])


def test_a_token_that_led_inside_the_model_but_not_at_the_output_is_not_called_never_the_top():
    """Seen on the embedded model (a draw at temperature 1): the lens showed <|end|> at rank 1
    after layers 0 and 1 and rank 2 at the output, while the panel, the stage's sentence and the
    map chip said it "was never the top candidate" / "top at the output"."""
    from app.page.controller import stages_of
    evs = events()
    last = next(e for e in reversed(evs) if e["type"] == "logit_lens")
    last["layers"] = [{**last["layers"][0], "chosen_rank": r} for r in (3, 1, 2)]  # embedding, layer 0, output
    v = view(evs)
    panel = v.render("logit_lens")
    assert "never the top" not in panel and "top candidate at layer 0 but not at the output" in panel, panel
    lens = next(s for s in stages_of(v) if s.key == "logit_lens")
    assert "never the top" not in lens.text and "top candidate after layer <b>0</b> but not at the output" in lens.text
    assert lens.chip == "drawn below the top"


def test_a_token_that_jumps_to_the_top_is_not_said_to_enter_the_top_10_at_the_same_layer():
    """Gemma 3's replay: "«Answer» was already the top candidate after layer 11, and stayed there.
    It entered the top 10 after layer 11": one event said twice."""
    from app.page.controller import stages_of
    evs = events()
    last = next(e for e in reversed(evs) if e["type"] == "logit_lens")
    last["layers"] = [{**last["layers"][0], "chosen_rank": r} for r in (900, 1, 1)]
    lens = next(s for s in stages_of(view(evs)) if s.key == "logit_lens")
    assert "already the top candidate right after the embedding" not in lens.text
    assert "top candidate after layer <b>0</b>, and stayed there" in lens.text and "entered the top 10" not in lens.text
    assert "The embedding alone ranked it <b>900</b>" in lens.text, lens.text


def test_a_request_stopped_before_any_step_is_not_still_on_its_way_and_held_no_kv():
    """Gemma 3's stop picture: Stop landed before the first engine step; the page said "Not reached
    yet: this request is still on its way", "waiting for the scheduler to admit the request…" and
    "At its end this request held K/V for 13 tokens" of a finished request that never ran."""
    from app.page.controller import stages_of
    v = never_ran()
    st = {s.key: s for s in stages_of(v)}
    for key in ("prefix", "timeline", "sampling"):
        text = next(s.text for s in st.values() if key in s.panels)
        assert "still on its way" not in text and "Never reached: the request ended (abort)" in text, (key, text)
    kv = next(s for s in st.values() if "kv" in s.panels)
    assert "held K/V for" not in kv.text and "never held K/V" in kv.text, kv.text
    assert "waiting for the scheduler" not in v.render("prefix") and "ended before the scheduler" in v.render("prefix")
    assert "when it finished" not in v.render("kv")
