"""A watched API request at the API's default capture level (basic) says, in each panel it
leaves empty, what that panel needs and how to ask for it (issue 38, item 9)."""
from __future__ import annotations

import html
import time

import pytest

from app.page.controller import Controller, Controls
from app.serving.requests import parse_body

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")


@pytest.fixture(scope="module")
def ctl(service):
    return Controller(service)


def test_a_watched_basic_request_says_how_to_get_the_full_panels(ctl, service):
    assert service.limits.api_trace_level == "basic"  # a plain curl's level
    gen = ctl.follow("curl-watcher", Controls(model=ctl.model["name"]))
    assert "watching" in next(gen)["status"]
    service.submit(parse_body({"model": "m", "messages": [{"role": "user", "content": "Hello from curl"}],
                               "max_tokens": 4, "trace_level": service.limits.api_trace_level}))
    end, seen = time.monotonic() + 60, {}
    for u in gen:
        seen.update(u)
        if "waiting for the next request" in str(u.get("status", "")) or time.monotonic() > end:
            break
    gen.close()
    for panel in ("embedding", "attention", "moe", "logit_lens"):
        text = html.unescape(str(seen[panel].get("value") if isinstance(seen[panel], dict) else seen[panel]))
        assert "not recorded" in text and '"trace_level": "full" in the API request\'s body' in text, (panel, text)
        assert "Capture level full on this page" in text, panel
