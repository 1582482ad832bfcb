"""Stop acts within one engine step: the step in flight when Stop is pressed may end, no
later one runs for that request (the engine's lock is not fair: step after step took it
before Stop's abort, which waited ~1.3 s). Counted in steps, with a step held inside the
engine's lock (issue 38, item 9)."""
from __future__ import annotations

import threading

import pytest

from app.page.controller import Controller, Controls
from tests.holds import HeldInside

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")


@pytest.fixture(scope="module")
def ctl(service):
    return Controller(service)


def test_after_stop_no_further_step_runs_for_the_request(ctl, service, monkeypatch):
    engine = service.engine
    held = HeldInside(k=4).install(engine, monkeypatch)
    c = Controls(user="Tell me about foxes.", max_tokens=60, seed="3", level="off", model=ctl.model["name"],
                 speculative=False)
    updates: list[dict] = []
    sender = threading.Thread(target=lambda: updates.extend(ctl.run("stopper", c)), daemon=True)
    sender.start()
    assert held.reached()  # step 4 runs, inside the engine's lock
    rid = ctl.view_of("stopper").request_id
    assert rid in held.steps[-1]
    stopper = threading.Thread(target=ctl.stop, args=("stopper",), daemon=True)
    stopper.start()  # Stop pressed while step 4 holds the lock
    while stopper.is_alive() and not getattr(engine, "_aborting", 1):  # its abort waits for the lock now
        pass
    held.release()
    stopper.join(60)
    sender.join(60)
    assert "finished (abort)" in updates[-1]["status"], updates[-1]["status"]
    after = [i for i, ids in enumerate(held.steps) if rid in ids and i >= 4]
    assert after == [], f"steps {after} ran for {rid} after Stop (step 4 was in flight)"
