"""Issue 38 item 4: a demo that answers the same way twice. The page opens greedy
(temperature 0), so the README's promise holds on SmolLM2: "What is the capital of France?"
with the page's default settings answers Paris, and the same answer every time."""
from __future__ import annotations

import pytest

from app.__main__ import build_service, parse_args
from app.page.controller import Controller, Controls
from tests.real_models import cached_gguf
from tests.service_utils import started

PROMISED = ("What is the capital of France?", "Paris")  # README.md's and docs/start.md's


@pytest.fixture(scope="module")
def smollm2():
    with started(build_service(parse_args(["--model", str(cached_gguf("smollm2"))]))) as svc:
        yield Controller(svc)


def test_the_page_opens_greedy():
    assert Controls().temperature == 0.0


@pytest.mark.slow
def test_the_default_settings_answer_the_promised_question_the_same_way_twice(smollm2):
    question, promised = PROMISED
    answers = []
    for key in ("first", "again"):
        c = Controls(**{**smollm2.opening.as_dict(), "user": question})  # only the prompt typed
        statuses = [u["status"] for u in smollm2.run(key, c) if "status" in u]
        assert "finished" in statuses[-1], statuses
        view = smollm2.sessions.get(key).view
        answers.append("".join(o["text"] for o in view.outputs if o.get("token_id", -1) >= 0))
    assert promised in answers[0], answers
    assert answers[0] == answers[1], answers
