"""Issue 43, item 3: the request's values beside the lines that made them. A real engine's
trace (a tiny MoE drafting for itself, twice the same prompt: the second hits the prefix
cache) gives every value the map names; each sits on the line the map says (data-v in the
view), is written there by the stage's rules (::after), escaped for CSS, and follows the pass
the panels show."""
from __future__ import annotations

import re

import pytest

from app.page.code_panel import code_body, stages, value_names, with_code
from engine import LLM, SamplingParams, TraceEvent
from visualizers.code_values import beside, css_string, values_style
from visualizers.journey import KEYS, Stage

PROMPT = [5, 9, 14, 3, 22, 7, 30, 11, 5, 9, 14, 3, 22, 7]  # 3 full blocks of 4 and 2 tokens


@pytest.fixture(scope="module")
def traced(checkpoint):
    path = checkpoint("qwen2_moe")
    llm = LLM(path, device="cpu", dtype="float32", block_size=4, draft=path, num_speculative_tokens=2)
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=6, ignore_eos=True)
    runs = []
    for _ in range(2):
        evs = [i.to_dict() for i in llm.stream(PROMPT, params=params, trace="full") if isinstance(i, TraceEvent)]
        rid = next(e["request_id"] for e in evs if e["type"] == "tokenize")
        runs.append((rid, evs))
    return runs[1]  # the second: its prefix hit


def test_every_value_the_map_names_comes_from_the_trace(traced):
    rid, events = traced
    said = beside(events, rid)
    named = {n for names in value_names().values() for n in names}
    assert named == set(said) | {"sampling.greedy"}, (named ^ set(said))  # the map and the trace agree, both ways
    assert re.fullmatch(r"hits = \[\d+, \d+, \d+\] of 3 full blocks", said["prefix.hits"])
    assert re.fullmatch(r"h = [0-9a-f]{16} \(the last that hit\)", said["prefix.hash"])
    short = [{**e, "full_blocks": 0, "cached_blocks": []} if e["type"] == "prefix_cache.lookup" else e for e in events]
    assert beside(short, rid)["prefix.hits"] == "never ran: no full block to hash"  # a prompt shorter than a block
    assert said["tokens.ids"].startswith("14 ids [5, 9, 14, 3, 22, 7, 30, 11, …]")
    assert "top_p = 0.9:" in said["sampling.top_p"] and said["sampling.temperature"] == "temperature = 0.8"
    assert re.fullmatch(r"drawn: token \d+ .*, p = \d\.\d+(e-\d+)?", said["sampling.drawn"])
    greedy = [{**e, "params": {**e["params"], "greedy": True}} if e["type"] == "sample" else e for e in events]
    assert re.fullmatch(r"greedy: token \d+ .*", beside(greedy, rid)["sampling.greedy"])
    assert "sampling.drawn" not in beside(greedy, rid) and "sampling.temperature" not in beside(greedy, rid)
    assert re.fullmatch(r"accepted = \d of k = \d \(the last round\)", said["spec.accepted"])
    assert re.fullmatch(r"layer \d, position \d+: experts \[\d+, \d+\], weights \[0\.\d\d, 0\.\d\d\]", said["moe.picks"])
    assert said["answer.sofar"].endswith("tokens so far") and said["batching.size"].startswith("step ")
    assert all(len(v) <= 120 for v in said.values())  # a few variables, not a debugger


def test_each_value_sits_on_its_line_in_the_view():
    for key, names in value_names().items():
        body = code_body(key)
        for name in names:
            assert f"data-v='{name}'" in body
        for e in stages()[key]:
            for line, name in e.get("values", ()):
                lo, hi = e["line"], e["end"]
                assert lo <= line <= hi and any(a <= line <= b for a, b in e["shown"])


def test_the_selected_pass_and_layer_pick_the_values(traced):
    rid, events = traced
    moe = [e for e in events if e["type"] == "moe" and e["request_id"] == rid]
    first = moe[0]
    said = beside(events, rid, position=first["start"], layer=first["layer"])
    assert said["moe.picks"].startswith(f"layer {first['layer']}, position {first['start']}: "
                                        f"experts {first['experts'][0]}")
    step = next(e for e in events if e["type"] == "schedule.step")
    start = step["batch"][0]["start"]  # the prefill's first row: after the prefix cache's hit
    assert beside(events, rid, position=start)["batching.size"].startswith(f"step {step['step']}: 1 sequence,")


def test_the_values_go_with_the_stage_words_escaped():
    css = css_string("</style><script>alert('x')</script> \"a\\b")
    assert "<" not in css and "'" not in css[1:-1] and '"' not in css[1:-1] and "\\" + "3c " in css
    style = values_style("sampling", ("sampling.drawn",), {"sampling.drawn": "token 5 '</style>'"})
    assert style.startswith("<style>.tt-code-box[data-key='sampling'] .tt-cl[data-v='sampling.drawn']::after")
    assert style.count("<") == 2  # its own tags only
    assert values_style("sampling", ("sampling.drawn",), {}) == ""


def test_with_code_adds_each_stages_rules(traced):
    rid, events = traced
    shown = [Stage(k, k, "<p>w</p>", ()) for k in KEYS]
    out = {s.key: s.text for s in with_code(shown, {}, events, rid)}
    assert "[data-v='prefix.hits']::after" in out["prefix"] and "data-v='moe.picks'" in out["layers"]
    assert "data-v='prefix.hits'" not in out["sampling"]  # each stage its own values
    assert "Ran for this request:" in out["layers"] and "plain torch: the router" in out["layers"] \
        or "cpu_moe.c" in out["layers"]  # the MoE's way too
