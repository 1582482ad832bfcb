"""CPU seconds per test (user + sys of the worker and of the processes it waited for), beside
pytest's --durations: on a shared or busy machine wall times grow with the load, CPU seconds
do not, so they say which tests cost the suite its time. Printed as the costliest 25 at the
end of a run (the phases a worker ran are sent to the controller with each report)."""
from __future__ import annotations

import resource

import pytest

KEY = "cpu_s"
_KEPT: dict[str, float] = {}  # nodeid -> CPU seconds, setup + call + teardown


def cpu_now() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


STASH = pytest.StashKey[dict]()


def measure(item: pytest.Item, phase: str):
    """The body of a hookwrapper around one phase (setup, call, teardown): its CPU seconds kept on the item."""
    start = cpu_now()
    yield
    item.stash.setdefault(STASH, {})[phase] = cpu_now() - start


def attach(item: pytest.Item, report: pytest.TestReport) -> None:
    """Put the phase's CPU seconds on its report (a worker's reports reach the controller)."""
    spent = item.stash.get(STASH, {}).get(report.when)
    if spent is not None:
        report.user_properties.append((KEY, round(spent, 2)))


def keep(report: pytest.TestReport) -> None:
    for key, value in report.user_properties:
        if key == KEY:
            _KEPT[report.nodeid] = _KEPT.get(report.nodeid, 0.0) + value


def summary(terminalreporter, top: int = 25) -> None:
    if not _KEPT:
        return
    total = sum(_KEPT.values())
    terminalreporter.write_sep("=", f"costliest {top} tests in CPU seconds (all: {total:.0f} s user + sys)")
    for nodeid, spent in sorted(_KEPT.items(), key=lambda kv: -kv[1])[:top]:
        terminalreporter.write_line(f"{spent:8.1f}s  {nodeid}")
