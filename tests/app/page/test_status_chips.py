"""Issue 38, item 9: the map's Stream chip ran a token behind the status line. Status said
"streaming, N tokens" in every update, the map's chips only every JOURNEY_EVERY seconds (and
the last "streaming" update carried no map at all). Both now come from the same events in
the same update: folded as the browser folds the updates (each output keeps its last value),
every Status that counts tokens sits beside a Stream chip with the same count."""
from __future__ import annotations

import re

import pytest

from app.page.controller import Controller, Controls
from tests.service_utils import app_service, started
from visualizers.selection import plural

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")

STREAM_CHIP = re.compile(r"data-key='answer'><b>Stream</b>(?:<small>(.*?)</small>)?</a>")
COUNTED = re.compile(r": (?:streaming|finished \(\w+\)), (\d+) tokens?$")


@pytest.fixture(scope="module")
def service(checkpoint):
    """The tiny MoE, each step paced so that its answer streams over several map updates."""
    with started(app_service(checkpoint, "--num-kv-blocks", "64", pace_s=0.04)) as svc:
        yield svc


def chip_count(map_html: str) -> str:
    m = STREAM_CHIP.search(map_html)
    assert m, map_html
    return m[1] or ""


def test_status_and_the_stream_chip_count_the_same_tokens(service):
    ctl = Controller(service)
    c = Controls(user="Tell me a long story about a fox.", max_tokens=24, seed="5", level="basic",
                 model=ctl.model["name"])
    screen: dict = {}
    pairs = []
    for update in ctl.run("status-chips", c):
        screen.update(update)
        if "status" in update and COUNTED.search(update["status"]):
            n = int(COUNTED.search(update["status"])[1])
            pairs.append((update["status"], chip_count(screen["map"])))
            assert pairs[-1][1] == (plural(n, "token") if n else ""), pairs
    assert pairs and "finished" in pairs[-1][0], pairs
    assert any("streaming" in s for s, _ in pairs), pairs  # not only the end's update was compared
