"""Issue 38, items 5, 7 and 8, on real runs of the embedded model through the page's controller:
the prefix-cache stage promises only the hit the block manager will give, and its second
request gets it; the KV panel zooms on the request's block table and, after the finish, says
what was freed and what the prefix cache keeps; attention keeps the first keys (the sink) and
the recent ones, the gap marked, at the same number of key columns."""
from __future__ import annotations

import re

import pytest

from app.page.controller import Controller, Controls
from app.page.page_state import stages_of
from app.page.second_request import send_second
from tests.service_utils import app_service, started
from visualizers.attention_rows import key_positions

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")

SYSTEM = "You are a helpful assistant."  # the page's own: 13 tokens with the embedded model's template
LONG = ("Tell me about the fox who lived at the edge of the old forest, the river that ran past her den, the birds "
        "that woke her every morning, the farmer who never saw her, and the winter when the snow came early and "
        "stayed until the spring flowers pushed through it again.")


@pytest.fixture(scope="module")
def ctl(checkpoint):
    """The embedded model (no draft: one pass a token), its default 16-token blocks."""
    with started(app_service(checkpoint, model=None, draft=None)) as svc:
        yield Controller(svc)


def _run(ctl, key: str, user: str, max_tokens: int = 3):
    c = Controls(system=SYSTEM, user=user, max_tokens=max_tokens, speculative=False, level="full",
                 model=ctl.model["name"])
    updates = list(ctl.run(key, c))
    assert "finished" in updates[-1]["status"], updates[-1]["status"]
    return ctl.sessions.get(key).view, c


def _lookup(view) -> dict:
    return view.first("prefix_cache.lookup")


def test_the_prefix_stage_promises_the_hit_its_second_request_gets(ctl):
    """Today's stage said a later request "that begins with the same 16 tokens (the same system
    prompt) will find them, a HIT"; the system prompt with its template is 13 tokens, so another
    question under it missed. The words now count full blocks, and the button's request hits."""
    view, c = _run(ctl, "first", "Tell me a short story about a fox.")
    assert not _lookup(view)["hit"]
    text = re.sub(r"<[^>]+>", "", next(s.text for s in stages_of(view) if s.key == "prefix"))
    assert "system prompt with its template is 13 tokens, less than one full block of 16" in text, text
    promised = re.search(r"begins with the same (\d+) tokens: it will find (\d+) blocks? \((\d+) tokens\), a HIT",
                         text)
    assert promised, text
    # the same system prompt, another question: the miss the words foretell
    other, _ = _run(ctl, "other", "What is the capital of France?")
    assert not _lookup(other)["hit"] and _lookup(other)["full_blocks"] >= 1
    # the button's request, on the tab that shows the first one
    updates = list(send_second(ctl, "first", c))
    assert updates[0]["user"]["value"].startswith("Tell me a short story about a fox.")
    second = ctl.sessions.get("first").view
    assert second.request_id != view.request_id
    hit = _lookup(second)
    assert hit["hit"] and len(hit["cached_blocks"]) == int(promised[2])
    assert hit["cached_tokens"] == int(promised[3]) == 16 * int(promised[2])
    assert set(hit["cached_blocks"]) <= set(next(e for e in view.events if e["type"] == "kv.alloc")["table"])


def test_the_kv_panel_zooms_on_the_block_table_and_says_what_the_finish_left(ctl):
    """Today: the request's blocks were dots in a corner of the pool and after the finish it "holds
    0 tokens in 0 blocks". Now each table entry is drawn with its slots, and the finish names the
    blocks freed and those the prefix cache keeps."""
    view, _ = _run(ctl, "kv", LONG[:120], max_tokens=4)
    table = next(e for e in reversed(view.events) if e["type"] == "kv.alloc")["table"]
    free = next(e for e in view.events if e["type"] == "kv.free")
    html = view.render("kv")
    entries = re.findall(r'class="tt-kvt-entry[^"]*" data-block="(\d+)" data-state="([^"]+)" data-fill="(\d+)"', html)
    assert [int(b) for b, _, _ in entries] == table
    states = {int(b): s for b, s, _ in entries}
    assert {b for b, s in states.items() if s == "cached"} == set(free["cached"]) != set()
    assert {b for b, s in states.items() if s == "freed"} == set(free["blocks"]) - set(free["cached"])
    usage = view.first("finish")["usage"]
    held = usage["prompt_tokens"] + usage["completion_tokens"] - 1
    assert sum(int(f) for _, _, f in entries) == held  # every token the request fed back has its slot
    assert "holds 0 tokens in 0 blocks" not in html and f"it held {held} tokens" in html
    assert "kept in the prefix cache" in html and "freed (" in html
    words = re.sub(r"<[^>]+>", "", next(s.text for s in stages_of(view) if s.key == "kv"))
    kept, freed = len(free["cached"]), len(free["blocks"]) - len(free["cached"])
    assert f"At the finish {freed} block{'s' if freed != 1 else ''} went back to the free list, and {kept} full " \
           f"block{'s' if kept != 1 else ''} stay" in words, words


def test_attention_keeps_the_sink_and_marks_the_gap(ctl):
    """Today the 64 key columns were the last 64 positions: a context past 64 lost position 0.
    Now the first 8 and the newest 52 are kept (60 columns, the bytes 64 recent ones cost), and
    the map draws the gap."""
    view, _ = _run(ctl, "attn", LONG, max_tokens=3)
    passes = sorted(view.by_type["attention"], key=lambda e: e["step"])  # (live steps' come first)
    n = view.first("tokenize")["count"]
    assert n > 64
    for e in passes:
        ctx = e["q_start"] + e["probs"]["shape"][2]
        keys = e["probs"]["shape"][-1]
        assert keys == 8 + 52 and e["k_head"] == 8
        pos = key_positions(e["k_head"], e["k_start"], keys)
        assert list(pos[:8]) == list(range(8)) and pos[-1] == ctx - 1 and pos[8] > 8
    html = view.render("attention")
    gap = re.search(r'class="tt-amap-c tt-amap-gap"[^>]*>⋯(\d+)–(\d+)<', html)
    assert gap and (int(gap[1]), int(gap[2])) == (8, passes[-1]["k_start"] - 1)
    cols = re.findall(r'class="tt-amap-c" data-pos="(\d+)"', html)
    assert cols[:8] == [str(i) for i in range(8)] and int(cols[8]) == passes[-1]["k_start"]
    assert "the attention sink" in html and "&quot;cols&quot;" in html  # hover names the true positions
