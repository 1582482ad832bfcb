"""The app loads its engines on a thread that then ends (engine/load_thread.py): the main
thread runs no OpenMP work of the load, so the engine's own thread is the only one whose
OpenMP workers spin between a step's parallel regions. What it costs when not so is timed in
docs/benchmarks.md; here: where the load runs, and that its result and errors come back."""
from __future__ import annotations

import threading

import pytest

from app.__main__ import build_services, parse_args
from engine import on_own_thread


def test_on_own_thread_returns_what_it_made_from_a_thread_that_has_ended():
    seen = []

    def make():
        seen.append(threading.current_thread())
        return "made"
    assert on_own_thread(make) == "made"
    assert seen[0] is not threading.main_thread() and not seen[0].is_alive()


def test_on_own_thread_raises_what_the_load_raised_in_the_callers_thread():
    error = ValueError("no such checkpoint")

    def make():
        raise error
    with pytest.raises(ValueError) as caught:
        on_own_thread(make)
    assert caught.value is error


def test_the_app_loads_its_engines_off_the_main_thread(checkpoint):
    said = []  # the load's progress lines, with the thread that said each
    models = build_services(parse_args(["--model", str(checkpoint("mixtral")), "--model", str(checkpoint("llama"))]),
                            say=lambda line: said.append((threading.current_thread(), line)))
    try:
        assert len(said) >= 2 and any("loading" in line for _, line in said)
        threads = {t for t, _ in said}
        assert threading.main_thread() not in threads and not any(t.is_alive() for t in threads)
        assert len(models.services) == 2  # both engines came back to the caller
    finally:
        for s in models.services:
            s.engine.shutdown()
