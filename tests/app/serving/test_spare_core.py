"""While a request sent from a page on this machine runs, the engine steps with a thread fewer
(app/serving/spare_core.py): the browser drawing it gets a core, and the engine's team no
longer waits for a thread the browser pre-empted. What it gives and costs is timed in
docs/benchmarks.md; here: whose requests count, the threads each step runs with on the
engine's own thread, and that all come back once the request ends."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from app.page.controller import Controller, Controls
from app.serving.spare_core import SpareCore
from tests.holds import StepGate


def on_a_thread(work):
    """work() on a thread of its own (torch's thread count is a thread's setting, and a global
    one new threads start from: both put back after)."""
    out, before = [], torch.get_num_threads()

    def run():
        try:
            out.append(work())
        finally:
            torch.set_num_threads(before)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out[0]


def test_only_requests_from_a_page_on_this_machine_take_a_thread_and_only_while_they_run():
    def work():
        spare = SpareCore(full=3)
        for rid, page in (("a", "127.0.0.1"), ("b", "::1"), ("c", "203.0.113.9"), ("d", None), ("e", "localhost")):
            spare.add(rid, page)
        seen = [(spare.before_step({"a", "b", "c", "d"}), torch.get_num_threads())]
        seen.append((spare.before_step({"b", "c"}), torch.get_num_threads()))  # a ended: b still runs
        seen.append((spare.before_step({"c", "d"}), torch.get_num_threads()))  # no local request left
        return seen, spare.local
    seen, local = on_a_thread(work)
    assert seen == [(2, 2), (2, 2), (3, 3)]
    assert local == {}  # (e never ran: dropped with the others)


def test_a_local_watcher_holds_a_thread_until_it_stops_watching():
    """Watch: a page here drawing another client's request takes the thread too, and gives it
    back when it stops watching though the request runs on; two such pages hold it until both stop."""
    def work():
        spare = SpareCore(full=2)
        assert spare.add("api", None) is False and spare.add("api", "203.0.113.9") is False  # a remote watcher
        seen = [spare.before_step({"api"})]
        assert spare.add("api", "127.0.0.1") and spare.add("api", "::1")  # two local watchers
        seen.append(spare.before_step({"api"}))
        spare.drop("api")
        seen.append(spare.before_step({"api"}))  # one still watches
        spare.drop("api")
        seen.append(spare.before_step({"api"}))  # none: the request runs on with every thread
        return seen
    assert on_a_thread(work) == [2, 1, 1, 2]


def test_one_thread_stays_one():
    def work():
        spare = SpareCore(full=1)
        spare.add("a", "127.0.0.1")
        return spare.before_step({"a"}), torch.get_num_threads()
    assert on_a_thread(work) == (1, 1)


def test_the_threads_start_from_the_engine_threads_own_count():
    def work():
        torch.set_num_threads(2)
        spare = SpareCore()
        spare.add("a", "127.0.0.1")
        return spare.before_step({"a"}), spare.full, spare.before_step(set()), torch.get_num_threads()
    assert on_a_thread(work) == (1, 2, 2, 2)


@pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")
def test_a_local_pages_request_steps_with_a_thread_fewer_and_a_remote_ones_with_all(service):
    """Through the page's controller, on the service's engine thread: the threads each event of
    the request was made with (its step's), for a page here and a page elsewhere."""
    spare = service.spare
    full_before, now_before = spare.full, spare.now
    spare.full, spare.now = 2, None  # (a 1-CPU machine's engine has no thread to spare: pretend it has 2)
    threads: dict[str, set[int]] = {}

    def sink(event):  # (its arrival is told on the thread that submits it: not a step's)
        if event.request_id is not None and threading.current_thread() is service._thread:
            threads.setdefault(event.request_id, set()).add(torch.get_num_threads())
    service.engine.tracer.add_sink(sink)
    try:
        ctl = Controller(service)
        ids = {}
        for page in ("127.0.0.1", "203.0.113.9"):
            c = Controls(user="Tell me about foxes.", max_tokens=6, seed="3", level="basic", model=ctl.model["name"])
            list(ctl.run(f"spare-{page}", c, page))
            ids[page] = ctl.sessions.get(f"spare-{page}").view.request_id
    finally:
        service.engine.tracer.remove_sink(sink)
        spare.full, spare.now = full_before, now_before
    assert threads[ids["127.0.0.1"]] == {1}
    assert threads[ids["203.0.113.9"]] == {2}


def watch_until_done(gen) -> None:
    """A Watch's updates until its request has finished."""
    for u in gen:
        if "waiting for the next request" in str(u.get("status", "")):
            break
    gen.close()


@pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")
def test_a_local_page_watching_an_api_request_steps_it_with_a_thread_fewer(service, monkeypatch):
    """Through the page's Watch: an API client's request (no page of its own) steps with a thread
    fewer once a page here watches it, and with all of them while a page elsewhere does. The
    engine waits before its second step until the watch has begun (StepGate)."""
    from app.serving.requests import build_body, parse_body
    spare = service.spare
    full_before, now_before = spare.full, spare.now
    spare.full, spare.now = 2, None
    threads: dict[str, list[int]] = {}

    def sink(event):
        if event.type == "token" and threading.current_thread() is service._thread:
            threads.setdefault(event.request_id, []).append(torch.get_num_threads())
    service.engine.tracer.add_sink(sink)
    try:
        ctl = Controller(service)
        ids = {}
        for page in ("127.0.0.1", "203.0.113.9"):
            gate = StepGate((2,)).install(service.engine, monkeypatch)
            gen = ctl.follow(f"watch-{page}", Controls(model=ctl.model["name"]), page)
            assert "watching" in next(gen)["status"]
            body = build_body("m", "", "Tell me about foxes.", 0.0, 0, 1.0, 12, 3, False, 1, "basic")
            rid = ids[page] = service.submit(parse_body(body)).request_id
            assert gate.reached(30) == 2
            watcher = threading.Thread(target=watch_until_done, args=(gen,))
            watcher.start()
            deadline = time.monotonic() + 30  # the watch of this request has begun
            while time.monotonic() < deadline and getattr(getattr(ctl.sessions.get(f"watch-{page}"), "view", None),
                                                          "request_id", None) != rid:
                time.sleep(0.01)
            gate.release_all()
            watcher.join(60)
            monkeypatch.undo()
    finally:
        service.engine.tracer.remove_sink(sink)
        spare.full, spare.now = full_before, now_before
    local, remote = threads[ids["127.0.0.1"]], threads[ids["203.0.113.9"]]
    assert local[0] == 2 and local[-1] == 1  # (its first token's step began before the watch)
    assert set(remote) == {2}
    assert spare.local == {}  # the watch ended: no thread held
