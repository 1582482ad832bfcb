"""The Layers stage's words follow the layer picker: the MoE routing they quote is the picked
layer's, as the MoE panel below them shows it (issue 38, item 9)."""
from __future__ import annotations

import pytest

from app.page.controller import Controller, Controls
from app.page.page_state import stages_of

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")


@pytest.fixture(scope="module")
def ctl(service):
    return Controller(service)


def test_the_layers_sentence_quotes_the_picked_layers_experts(ctl):
    c = Controls(user="Tell me about foxes.", max_tokens=4, seed="3", level="full", model=ctl.model["name"])
    last = list(ctl.run("layers", c))[-1]
    assert "finished" in last["status"]
    words = {st.key: st.text for st in stages_of(ctl.view_of("layers"))}
    assert "In layer 0 the router" in words["layers"]
    out = ctl.redraw("layers", Controls(layer=1, head=0))  # the picker moved to layer 1
    assert "In layer 1 the router" in out["stage:layers"] and "In layer 1" not in words["layers"]
    assert "layer 1" in out["moe"]
    back = ctl.pick_head("layers", "0:0:nonce")  # a cell of the attention overview: layer 0 again
    assert "In layer 0 the router" in back["stage:layers"]
