"""Spies for the tests of which way a pass really ran (code_ran's names in schedule.step):
each engine pass gets a set, and each spied function adds its way's name to the current one."""
from __future__ import annotations


def record_passes(monkeypatch, runner) -> list[set]:
    """A list that gains an empty set at the start of each of the runner's passes."""
    passes: list[set] = []
    real_run = runner.run

    def run(*args, **kwargs):
        passes.append(set())
        return real_run(*args, **kwargs)
    monkeypatch.setattr(runner, "run", run)
    return passes


def spy(monkeypatch, passes: list[set], owner, name: str, way: str) -> None:
    """owner.name, when called during a pass, adds `way` to that pass's set."""
    real = getattr(owner, name)

    def called(*args, **kwargs):
        passes[-1].add(way)
        return real(*args, **kwargs)
    monkeypatch.setattr(owner, name, called)
