"""engine/code_map.py against this checkout: every function it names resolves (so moving,
renaming or deleting one without the map following fails here), each mark is on exactly one
line inside its function, the source shown is the file's own, every stage of the journey has
code, and a long function shows the lines around its marks."""
from __future__ import annotations

import pytest

from engine.code_map import PATHS, STAGE_CODE, Code
from engine.code_source import LONG, ROOT, CodeMapError, _shown, resolve, stage_code
from visualizers.journey import KEYS

ENTRIES = [(key, code) for key, codes in STAGE_CODE.items() for code in codes]


def test_every_stage_of_the_journey_has_code():
    assert set(STAGE_CODE) == set(KEYS)
    assert all(STAGE_CODE[k] for k in KEYS)


@pytest.mark.parametrize("key,code", ENTRIES, ids=[f"{k}-{c.name}-{c.path}" for k, c in ENTRIES])
def test_each_named_function_is_where_the_map_says(key, code):
    e = resolve(code)  # raises CodeMapError: a name moved, renamed or deleted without the map following
    path = ROOT / e["file"]
    assert path.is_file() and e["file"].startswith("engine/")
    lines = path.read_text().splitlines()
    assert e["source"] == lines[e["line"] - 1:e["end"]]  # the checkout's own lines, not a copy
    assert e["qualname"].split(".")[-1] in "\n".join(e["source"][:8])  # its def is among them
    for mark, at in zip(code.marks, e["marks"]):
        assert e["line"] <= at <= e["end"] and mark in lines[at - 1]
    for start, end in e["shown"]:
        assert e["line"] <= start <= end <= e["end"]
    assert code.path in PATHS or not code.path
    assert code.why and len(code.why) < 160


def test_stage_code_holds_every_entry_without_errors():
    code = stage_code()
    assert [len(v) for v in code["stages"].values()] == [len(STAGE_CODE[k]) for k in code["stages"]]
    assert not [e for es in code["stages"].values() for e in es if "error" in e]
    assert code["paths"] == PATHS


def test_a_name_the_checkout_lacks_fails():
    with pytest.raises(CodeMapError, match="not in this checkout"):
        resolve(Code("engine.block_manager:BlockManager.match_everything", "renamed"))
    with pytest.raises(CodeMapError, match="not in this checkout"):
        resolve(Code("engine.no_such_module:f", "moved"))


def test_a_mark_outside_the_function_fails():
    with pytest.raises(CodeMapError, match="on 0 lines"):
        resolve(Code("engine.block_manager:chain_hash", "x", marks=("hits.append(bid)",)))
    with pytest.raises(CodeMapError, match="on 2 lines|on [3-9] lines"):
        resolve(Code("engine.block_manager:BlockManager.match_tokens", "x", marks=("bs",)))


def test_a_long_function_shows_its_signature_and_the_lines_around_its_marks():
    assert _shown(10, 40, [20]) == [[10, 40]]  # short: all of it
    first, last = 100, 100 + LONG + 40
    assert _shown(first, last, []) == [[first, first + LONG - 1]]
    spans = _shown(first, last, [130, 134, 190])
    assert spans[0] == [100, 102] and [124, 140] in spans and [184, 196] in spans
    assert sum(b - a + 1 for a, b in spans) < LONG


LONG_ONES = [(key, code) for key, code in ENTRIES if (lambda e: e["end"] - e["line"] + 1 > LONG)(resolve(code))]


def test_a_real_long_function_in_the_map_shows_the_part_that_matters():
    assert LONG_ONES, "the map names no function over LONG lines: the rule is only tested on synthetic input"
    for key, code in LONG_ONES:
        e = resolve(code)
        assert code.marks, f"{code.name}: a long function needs marks to say which part matters"
        shown = [n for a, b in e["shown"] for n in range(a, b + 1)]
        assert all(m in shown for m in e["marks"]) and len(shown) < e["end"] - e["line"] + 1
        assert e["shown"][0][0] == e["line"]  # its signature first
    kernel = resolve(next(c for _, c in ENTRIES if c.name.endswith(":_paged_decode_kernel")))
    text = [kernel["source"][n - kernel["line"]] for a, b in kernel["shown"] for n in range(a, b + 1)]
    assert any("def _paged_decode_kernel(" in t for t in text)
    assert any("alpha = tl.exp(m - m_new)" in t for t in text)  # the online softmax, around its marks
    assert not any("q_offs = seq * stride_q_b" in t for t in text)  # the set-up left out, counted in the view
