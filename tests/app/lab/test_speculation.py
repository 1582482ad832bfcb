"""Speculation by content on the embedded model at size ci: n-gram drafts on the copy
prompts are accepted more often than on prose; no speculation makes one token a pass."""
import pytest

from app.lab import run
from app.lab.speculation import settings
from tests.app.lab.lab_utils import run_one
from tests.app.lab.english_left import left_in_chinese
from visualizers.lab_speculation import by_content


@pytest.fixture(scope="module")
def result():
    return run("speculation", size="ci", repeats=1).to_json()  # counts: one run says them


def test_ngram_drafts_are_accepted_more_on_copy_than_on_prose(result):
    m = {s["setting"]["name"]: s["metrics"] for s in result["settings"]}
    assert set(m) == {"none", "draft", "ngram"}
    assert m["ngram"]["copy_acceptance"] > m["ngram"]["prose_acceptance"]
    assert m["ngram"]["copy_tokens_per_pass"] > m["ngram"]["prose_tokens_per_pass"]
    for kind in ("copy", "code", "prose"):
        assert m["none"][f"{kind}_tokens_per_pass"] == 1.0 and m["none"][f"{kind}_proposed"] == 0
        for name in ("draft", "ngram"):
            assert 0 <= m[name][f"{kind}_accepted"] <= m[name][f"{kind}_proposed"]
            assert m[name][f"{kind}_tokens_per_pass"] >= 1.0


def test_the_same_greedy_text_whatever_the_proposer(result):
    """Greedy speculation keeps the target's own tokens: every request made its max_tokens."""
    for s in result["settings"]:
        assert all(r["output_tokens"] == s["setting"]["options"]["max_tokens"] for r in s["per_request"])


def test_a_model_without_a_served_draft_has_no_draft_setting():
    assert [s.name for s in settings("ci", "some/other-model")] == ["none", "ngram"]


def test_acceptance_figure_against_the_trace():
    s, trace = run_one("speculation", "ngram")
    rounds = [e for e in trace if e["type"] == "spec"]
    assert sum(e["k"] for e in rounds) == sum(s["metrics"][f"{k}_proposed"] for k in ("copy", "code", "prose"))
    copy_ids = {r["request_id"] for r in s["per_request"] if r["role"] == "copy"}
    copy = [e for e in rounds if e["request_id"] in copy_ids]
    fig = by_content([s], "acceptance", "t", "u")
    assert fig["data"][0]["y"][0] == sum(e["accepted"] for e in copy) / sum(e["k"] for e in copy)


def test_the_result_drawn_in_chinese_leaves_no_english(result):
    assert not left_in_chinese(result), left_in_chinese(result)
