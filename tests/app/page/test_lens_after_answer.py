"""Issue 40, item 2 on the page: a full request's answer is shown, finished, as soon as its last
token comes; Status then says its tokens' logit lenses are being computed (they come after
the last token), and the final panels and the recording follow the trace's end. While it
streamed, every panel showed the newest pass that had its lens; a request whose last step
knows it ends it computes that step's lens at once, so the panels show the last pass while the
lenses before it are computed. Held with the real engine (tests/holds.AfterFinish), not timing."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from app.page.controller import Controller, Controls
from tests.holds import AfterFinish
from tests.service_utils import app_service, started

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")


def value(v):
    return v.get("value") if isinstance(v, dict) else v


@pytest.mark.parametrize("end_known", [False, True])
def test_the_answer_first_then_the_lens_then_the_end(checkpoint, monkeypatch, end_known):
    """end_known: the request's last step knows it ends it (max_tokens here) and computes its lens at
    once; else (an end found only as its token is appended, a stop string's) its lens waits too."""
    svc = app_service(checkpoint)
    svc.engine.capture = replace(svc.engine.capture, lens_live_seconds=1e9)  # live: the first token's (and the last's)
    if not end_known:
        monkeypatch.setattr(svc.engine.step_trace, "last_step", lambda seq, config: None)
    hold = AfterFinish().install(svc.engine, monkeypatch)
    with started(svc):
        ctl = Controller(svc)
        c = Controls(user="Count to ten.", max_tokens=10, seed="1", level="full", model=ctl.model["name"])
        screen, computing = {}, None
        for update in ctl.run("lens-after", c):
            screen.update({n: value(v) for n, v in update.items() if isinstance(value(v), str)})
            if "computing the logit lens" in screen.get("status", "") and computing is None:
                assert hold.reached.wait(60)  # the engine waits before the first of the lenses after the answer
                computing = dict(screen)
                hold.go.set()
    view = ctl.sessions.get("lens-after").view
    n = len(view.generated_ids())
    assert computing is not None, screen["status"]
    assert re.search(r"finished \(\w+\), \d+ tokens? · computing the logit lens", computing["status"])
    # shown at once; the trace's end adds only the engine's own times (its finish event's trace_seconds)
    own = re.compile(r" · the engine's own: first token at [^·]*\(tracing added [^)]*\)")
    assert own.search(screen["answer"]) and not own.search(computing["answer"])
    assert "Stop" not in computing.get("stop", "") and computing["answer"] == own.sub("", screen["answer"])
    said = re.search(r'class="tt-sel-pass">(.*?)</div>', computing["sampling"])[1]
    if end_known:  # the last pass, its lens computed at its step: the tokens between wait
        assert "newer pass" not in said and "newer pass" not in computing["logit_lens"], said
        last = max(e["position"] for e in view.by_type["logit_lens"])
        assert f"position {last} " in computing["logit_lens"]
    else:  # while the lens was behind, the panels showed the newest pass with a lens: the first token's
        assert "the newest pass whose logit lens is computed" in computing["logit_lens"]
        assert f"the {n - 1} newer pass" in said, said
    assert "computing" not in screen["status"] and "finished" in screen["status"]
    assert len(view.by_type["logit_lens"]) == n and view.first("finish") is not None
    assert "newer pass" not in screen["logit_lens"]  # the end: the newest pass, with its lens
