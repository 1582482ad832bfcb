"""The code view (visualizers/code_view.py) and what ran (visualizers/code_facts.py), from
plain dicts: escaped everywhere, marked lines lit, a long function's gaps counted, closed by
default; the ways a request took read from its events, the others named."""
from __future__ import annotations

import html
import re

from visualizers.code_facts import ran_html, values, ways_ran
from visualizers.code_view import code_css, function_html, stage_code_html, summary_text

SOURCE = ['def evil(x):', '    """<script>alert(1)</script> & more"""', '    y = x < 3  # <b>', '    return y']


def entry(**kw):
    e = {"name": "engine.m:evil", "qualname": "evil", "why": "a <why> & this", "path": "", "file": "engine/m.py",
         "line": 10, "end": 13, "marks": [12], "shown": [[10, 13]], "source": SOURCE}
    return e | kw


def text_of(h: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", h))


def test_source_and_words_are_escaped():
    h = function_html(entry())
    assert "<script>" not in h and "<b>" not in h and "<why>" not in h
    assert "&lt;script&gt;" in h and "a &lt;why&gt; &amp; this" in h
    assert "<script>alert(1)</script>" in text_of(h)  # the text itself survives, shown as text


def test_line_numbers_and_the_marked_line():
    h = function_html(entry())
    assert [int(n) for n in re.findall(r"<span class='tt-cl[^']*'><i>(\d+)</i>", h)] == [10, 11, 12, 13]
    marked = re.findall(r"<span class='tt-cl tt-cm'><i>(\d+)<", h)
    assert marked == ["12"]
    assert "engine/m.py:10" in h and "class=\"k\"" in h  # highlighted: `def` is a keyword span


def test_a_long_function_counts_the_lines_left_out():
    src = [f"    a{i} = {i}" for i in range(100)]
    h = function_html(entry(source=["def f():"] + src, end=110, shown=[[10, 12], [50, 60]], marks=[55]))
    assert "⋯ lines 13–49 not shown" in h and "⋯ lines 61–110 not shown" in h
    assert h.count("<i>") == 3 + 11


def test_the_stage_view_is_one_closed_line_until_opened():
    h = stage_code_html("prefix", [entry(), entry(name="engine.m:g", qualname="g")], {})
    assert h.startswith("<details class='tt-code-box' data-key='prefix'>") and " open" not in h.split(">")[0]
    assert summary_text([entry(), entry()]) == "The code of this stage: engine/m.py:10 evil and 1 more"
    assert stage_code_html("x", []) == ""


def test_the_way_that_ran_and_the_ways_not_taken():
    names = {"c_fused": "the fused C layer", "torch": "plain torch"}
    es = [entry(path="c_fused"), entry(path="torch", name="engine.m:t", qualname="t")]
    h = stage_code_html("layers", es, names, ran=["c_fused"])
    assert "one way: the fused C layer · ran for this request" in text_of(h)
    assert "one way: plain torch · not taken by this request" in text_of(h)


def test_the_view_drawn_once_is_marked_by_the_requests_style():
    h = stage_code_html("layers", [entry(path="c_fused")], {"c_fused": "fused"})
    assert "data-path='c_fused'" in h and "tt-way-ran" in h and "tt-way-not" in h  # both, hidden
    style = ran_html("layers", EVENTS, "r", {})
    assert style.startswith("<style>") and "</style>" in style
    assert ".tt-code-box[data-key='layers'] .tt-code-fn[data-path='c_fused'] .tt-way-ran" in style
    assert "[data-path='c_kernel'] .tt-way-not" in style and "[data-path='torch'] .tt-way-ran" in style
    assert "<style>" not in ran_html("prefix", EVENTS, "r", {})


def test_a_missing_function_says_so():
    h = function_html({"name": "engine.m:<gone>", "why": "w", "error": "engine.m:<gone>: not in this checkout"})
    assert "not found in this checkout" in h and "<gone>" not in h


def test_css_scopes_the_highlighting():
    assert ".tt-code-src .k" in code_css()


STEP = {"type": "schedule.step", "request_id": None}
EVENTS = [
    {"type": "prefix_cache.lookup", "request_id": "r", "step": 1, "cached_blocks": [3, 4], "cached_tokens": 32,
     "full_blocks": 3},
    STEP | {"step": 1, "attention": "torch", "batch": [{"request_id": "r", "kind": "prefill"}]},
    STEP | {"step": 2, "attention": "torch", "batch": [{"request_id": "r", "kind": "prefill"}]},
    STEP | {"step": 3, "attention": "c_fused", "batch": [{"request_id": "r", "kind": "decode"}]},
    STEP | {"step": 4, "attention": "c_fused", "batch": [{"request_id": "other", "kind": "decode"}]},
    STEP | {"step": 5, "batch": [{"request_id": "r", "kind": "decode"}]},  # no news: the way of its step before
    {"type": "spec", "request_id": "r", "step": 5, "method": "ngram", "accepted": 2, "k": 4,
     "token_kind": "corrected"},
    {"type": "sample", "request_id": "r", "step": 5, "params": {"top_p": 0.9, "greedy": False},
     "stages": {"top_p": {"kept": 17}}, "token_prob": 0.42},
]


def test_ways_ran_reads_the_engines_reports():
    ways = ways_ran(EVENTS, "r")
    assert ways["layers"] == {"torch": [1, 2], "c_fused": [3, 5]}  # step 4 computed another request
    assert ways["timeline"] == {"chunked": [1, 2]}
    assert ways["spec"] == {"ngram": [5]}
    assert "layers" not in ways_ran([STEP | {"step": 1, "batch": [{"request_id": "r"}]}], "r")  # an older trace


def test_the_ran_line_names_the_others():
    names = {"c_fused": "fused <C>", "torch": "torch", "c_kernel": "kernel", "triton": "triton"}
    h = ran_html("layers", EVENTS, "r", names)
    assert "fused &lt;C&gt; in steps 3–5" in h and "torch in steps 1–2" in h
    assert "Not taken here: kernel; triton" in text_of(h)
    assert "chunked prefill" in text_of(ran_html("timeline", EVENTS, "r", names))


def test_values_beside_the_code():
    assert "blocks [3, 4] reused; 32 tokens" in values(EVENTS, "prefix")
    short = [{"type": "prefix_cache.lookup", "cached_blocks": [], "full_blocks": 0}]
    assert values(short, "prefix") == "no full block to hash: chain_hash never ran, nothing reused"
    hashed = [{**EVENTS[0], "hashes": [-1, 255]}]
    assert "reused, chain hash ffffffffffffffff → 00000000000000ff; 32 tokens" in values(hashed, "prefix")
    assert values(EVENTS, "sampling") == "top_p = 0.9 kept 17 tokens; drew p = 0.42"
    assert values(EVENTS, "spec") == "the last round: 2 of 4 proposals accepted, then a corrected token"
    assert values(EVENTS, "embedding") == "" and ran_html("embedding", EVENTS, "r", {}) == ""
