"""While a request sent from a page on this machine runs, the engine steps with a thread fewer
(app/serving/spare_core.py): the browser drawing it gets a core, and the engine's team no
longer waits for a thread the browser pre-empted. What it gives and costs is timed in
docs/benchmarks.md; here: whose requests count, the threads each step runs with on the
engine's own thread, and that all come back once the request ends."""
from __future__ import annotations

import threading

import pytest
import torch

from app.page.controller import Controller, Controls
from app.serving.spare_core import SpareCore


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
    assert local == set()  # (e never ran: dropped with the others)


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
