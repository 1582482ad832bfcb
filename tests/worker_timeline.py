"""Where the workers' wall time went (printed after --durations): each worker's busy time and
when its last test ended, and the modules that ended last. With --dist loadfile a long module
that starts late keeps one worker running alone while the others wait: this shows it, so the
order (tests/cost_markers.py) can be fixed from a real run instead of a guess."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pytest


@dataclass
class Span:
    start: float = float("inf")
    stop: float = 0.0
    busy: float = 0.0
    worker: str = "-"

    def add(self, report: pytest.TestReport, worker: str) -> None:
        self.start, self.stop = min(self.start, report.start), max(self.stop, report.stop)
        self.busy += report.stop - report.start
        self.worker = worker


@dataclass
class Timeline:
    modules: dict[str, Span] = field(default_factory=lambda: defaultdict(Span))
    workers: dict[str, Span] = field(default_factory=lambda: defaultdict(Span))

    def keep(self, report: pytest.TestReport) -> None:
        if not hasattr(report, "start"):
            return
        node = getattr(report, "node", None)  # xdist: the worker that ran it
        worker = getattr(getattr(node, "gateway", None), "id", "main")
        self.modules[report.nodeid.split("::", 1)[0]].add(report, worker)
        self.workers[worker].add(report, worker)

    def summary(self, terminalreporter, top: int = 8) -> None:
        if not self.workers:
            return
        t0 = min(s.start for s in self.workers.values())
        end = max(s.stop for s in self.workers.values())
        terminalreporter.write_sep("=", f"workers (wall {end - t0:.0f} s): busy s / last test ended at s")
        for name, s in sorted(self.workers.items()):
            terminalreporter.write_line(f"{name:>6}  busy {s.busy:6.0f}  ended {s.stop - t0:6.0f}")
        terminalreporter.write_line("modules that ended last (start-end s, worker):")
        for name, s in sorted(self.modules.items(), key=lambda kv: -kv[1].stop)[:top]:
            terminalreporter.write_line(f"  {s.start - t0:6.0f}-{s.stop - t0:6.0f}  {s.worker:>5}  {name}")


TIMELINE = Timeline()
