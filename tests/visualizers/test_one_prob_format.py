"""One probability format on the whole page: the Sampling, Speculation and Logit lens panels
print an unlikely token's probability as the stage sentence does (0.00049, never 4.9e-4)."""
from __future__ import annotations

import visualizers as viz
from visualizers.stages.facts import prob

P = 0.00049  # a draw at temperature 1 may take a token this unlikely


def test_the_stage_sentence_and_every_panel_print_one_format():
    assert prob(P) == "0.00049"
    sample = {"position": 3, "candidates": [7, 8], "token_id": 8, "token_prob": P, "entropy": 0.7,
              "params": {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "greedy": False},
              "stages": {"logits": {"probs": [1 - P, P], "kept": 2}}}
    spec = {"k": 2, "proposed": [7, 8], "proposed_text": ["a", "b"], "draft_probs": [0.5, P],
            "target_probs": [0.4, P], "accepted": 1, "token": 9, "token_text": "c", "token_kind": "corrected",
            "acceptance_rate": 0.5, "greedy": False}
    lens = {"position": 3, "token_id": 8, "token_text": "b",
            "layers": [{"top_ids": [7, 8], "top_probs": [1 - P, P], "top_texts": ["a", "b"],
                        "chosen_rank": 2, "chosen_prob": P}]}
    for html in (viz.sampling_html([sample], {7: "a", 8: "b"}), viz.spec_html([spec]),
                 viz.logit_lens_html([lens])):
        assert "0.00049" in html and "e-4" not in html
