"""The MoE panel for DeepSeek's routing, on hand-made events whose right answer is known:
the shared-expert column, the groups each token may choose from (the others hatched), the
scores before and after the balance bias, and the picks the bias changed."""
from __future__ import annotations

import re

import visualizers as viz
from visualizers.selection import Selection

RULES = {"shared_experts": 2, "scoring": "sigmoid", "n_group": 4, "topk_group": 2, "correction_bias": True,
         "routed_scaling_factor": 2.5}


def event(start: int = 0) -> dict:
    # 8 experts in 4 groups of 2; token 0 kept groups 0 and 2, token 1 groups 1 and 3
    return {"layer": 3, "start": start, "experts": [[4, 1], [3, 6]], "weights": [[1.5, 1.0], [1.25, 1.25]],
            "num_experts": 8, "top_k": 2, "batch_load": [0] * 8, "deepseek": RULES,
            "scores": [[0.61, 0.4], [0.5, 0.5]], "biased": [[0.85, 0.52], [0.7, 0.55]],
            "without_bias": [[1, 5], [3, 6]], "groups": [[0, 2], [1, 3]]}


def selected(pos: int, labels: list[str]) -> Selection:
    return Selection(read=pos, labels=tuple(labels))


def test_rules_shared_column_and_hatched_groups():
    html = viz.moe_html([event()], 3, labels=["a", "b"])
    assert "2 shared experts every token passes through, beside the 8 routed ones" in html
    assert "the experts fall into 4 groups of 2; each token&#x27;s top-2 come only from its 2 best groups" in html
    assert "e_score_correction_bias" in html and "× 2.5" in html
    assert "the bias changed the picks of 1 of 2 tokens here" in html  # token 0: 1, 5 unbiased -> 1, 4
    assert html.count("tt-moe-shared") == 2 and html.count(">all</td>") == 2
    assert html.count("class='tt-moe-group'") == 4
    # token 0 kept groups 0 and 2: experts 2, 3, 6, 7 ruled out; token 1 kept 1 and 3: 0, 1, 4, 5
    off = re.findall(r"expert (\d): group (\d) not kept", html)
    assert sorted(off) == sorted([("2", "1"), ("3", "1"), ("6", "3"), ("7", "3"),
                                  ("0", "0"), ("1", "0"), ("4", "2"), ("5", "2")])
    assert "router weight 1.5000 · score 0.6100 before the bias, 0.8500 after" in html


def test_selected_token_shows_groups_scores_and_what_the_bias_changed():
    labels = ["a", "b"]
    html = viz.moe_html([event()], 3, labels=labels, selection=selected(0, labels))
    assert "groups kept: 0, 2 (of 4)" in html
    assert "scores before → after the bias: expert 4: 0.610 → 0.850, expert 1: 0.400 → 0.520" in html
    assert "without the bias the router would have picked experts 1, 5: the bias swapped 5 for 4" in html
    same = viz.moe_html([event()], 3, labels=labels, selection=selected(1, labels))
    assert "without the bias the router would have picked the same experts" in same


def test_v2_softmax_without_bias_or_shared():
    e = event()
    e["deepseek"] = {**RULES, "shared_experts": 0, "scoring": "softmax", "correction_bias": False,
                     "routed_scaling_factor": 1.0}
    for key in ("biased", "without_bias"):
        del e[key]
    html = viz.moe_html([e], 3, labels=["a", "b"], selection=selected(0, ["a", "b"]))
    assert "softmax scores choose and weigh the experts (× 1)" in html
    assert "shared" not in html and "bias" not in html
    assert "scores: expert 4: 0.610, expert 1: 0.400" in html


def test_other_models_unchanged():
    e = {k: v for k, v in event().items() if k in ("layer", "start", "experts", "weights", "num_experts", "top_k",
                                                   "batch_load")}
    html = viz.moe_html([e], 3, labels=["a", "b"])
    assert "shared" not in html and "group" not in html and "hatched" not in html


def test_token_text_is_escaped():
    bad = "<img src=x onerror=alert(1)>"
    html = viz.moe_html([event()], 3, labels=[bad, "b"], selection=selected(0, [bad, "b"]))
    assert bad not in html and "onerror=alert(1)>" not in html
