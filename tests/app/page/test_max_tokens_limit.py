"""One max-tokens limit on the page and the API: the slider ends where the API's limit does
(the context left), per model, and a Send the context cannot hold is refused as the API
refuses it, with the same words under the slider (issue 38, item 9)."""
from __future__ import annotations

import re

import pytest

from app.page.controller import Controller, Controls
from app.page.texts import max_label
from app.serving.limits import RequestRefused
from app.serving.requests import parse_body

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")


@pytest.fixture(scope="module")
def ctl(service):
    return Controller(service)


def test_the_slider_ends_at_the_context_left_and_send_is_treated_as_the_api(ctl, service):
    context = service.model_info()["max_model_len"]
    assert ctl.cap == context - 1  # not a page-only 512
    picked = ctl.pick_model("limit", Controls(model=ctl.model["name"], max_tokens=10 ** 6))
    assert picked["max_tokens"]["maximum"] == context - 1 and picked["max_tokens"]["value"] == context - 1
    # the label says what the limit is: the context less the prompt, not "≤ 8,191, the context left" (the
    # slider's end leaves a one-token prompt; this prompt leaves less)
    assert f"the context left: {context:,} less the prompt's tokens" in picked["max_tokens"]["label"]
    c = Controls(user="Tell me about foxes.", max_tokens=ctl.cap, seed="3", level="off", model=ctl.model["name"])
    updates = list(ctl.run("limit", c))  # the slider's end, with a prompt of more than one token
    hint = updates[-1]["hint_max"]
    assert "rejected" in updates[-1]["status"] and "maximum context length" in hint, updates[-1]
    left = int(re.search(r"ask for at most ([\d,]+)", hint).group(1).replace(",", ""))
    with pytest.raises(RequestRefused) as api:  # the API, given the same body, says the same
        service.submit(parse_body(ctl.view_of("limit").body, service.limits.max_tokens_cap))
    assert f"ask for at most {left:,}" in str(api.value) and api.value.code == "context_length_exceeded"
    ok = list(ctl.run("limit", Controls(**{**c.as_dict(), "max_tokens": left})))  # the context left: runs
    assert "finished" in ok[-1]["status"], ok[-1]["status"]


def test_a_server_cap_is_named_as_the_cap():
    assert max_label(256, 8192) == "Max tokens (≤ 256, the server's cap, and the context left)"
    assert max_label(8191, 8192) == "Max tokens (≤ the context left: 8,192 less the prompt's tokens)"
