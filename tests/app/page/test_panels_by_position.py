"""The pass panels list a request's tokens by position, whatever order their events came in: a
`full` trace's come in the order computed (a live step's, the last one's too, before the steps
between them, built after the answer). Seen before: the Sampling panel's strip read "The . <|end|>
only thing ..." and its line "token 3 of 14" for the newest pass. The real engine (the tiny MoE
with its draft), through the page's controller."""
from __future__ import annotations

import pytest

from app.page.controller import Controller, Controls
from app.page.page_state import stages_of
from visualizers._html import prob

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")


def test_the_newest_pass_is_the_last_token_and_the_strip_runs_in_order(service):
    ctl = Controller(service)
    c = Controls(user="Tell me a short story about a fox.", max_tokens=12, seed="3", level="full",
                 model=ctl.model["name"])
    list(ctl.run("by-position", c))
    view = ctl.sessions.get("by-position").view
    arrived = [e["position"] for e in view.events if e["type"] == "sample"]
    assert arrived != sorted(arrived)  # the last step's came before the steps between
    for kind, key in (("sample", "position"), ("logit_lens", "position"), ("embed", "start"),
                      ("attention", "q_start"), ("moe", "start")):
        got = [e[key] for e in view.by_type[kind]]
        assert got == sorted(got) and len(got) == len([e for e in view.events if e["type"] == kind]), kind
    n, last = len(arrived), max(arrived)
    for panel in ("sampling", "logit_lens"):
        assert f"token {n} of {n} · position {last} " in view.render(panel), panel
    newest = view.by_type["sample"][-1]  # the Sampling stage's values quote its draw
    said = next(st.text for st in stages_of(view) if st.key == "sampling")
    assert f"p = {prob(newest['token_prob'])}" in said, said
    strip = view.render("sampling")
    texts = [e["token_text"] for e in view.by_type["sample"]]
    at = strip.find("every token")
    for t in texts:  # each token after the one before it
        at = strip.find(t, at + 1)
        assert at >= 0, (t, texts)
