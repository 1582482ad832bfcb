"""A core left to the browser on this machine while the request its page sent runs.

Why: the engine's pass runs on every core (OpenMP's team, a thread a core), and each parallel
region waits for its slowest thread. A browser on the same machine, drawing the page as the
request streams, takes a core now and then; the team's thread there is pre-empted and every
region waits for it. On 2 CPUs with the page's Chromium beside the server (2026-12-07, the
engine's own time a token as the page quotes it): SmolLM2 34 ms at 2 threads, 18 ms at 1 (the
API alone, no page: 10-14 ms at 2, 16 at 1; docs/benchmarks.md). So while a request sent from a page whose address is
this machine's runs, or one such page watches (Watch: another client's request), the engine
steps with a thread fewer; otherwise with all of them. (A page reached through a tunnel on this
machine, Gradio's share link, counts as local too.)
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from app.serving.limits import is_loopback


@dataclass
class SpareCore:
    local: dict[str, int] = field(default_factory=dict)  # live requests a page on this machine draws -> how many
    full: int | None = None  # the engine thread's threads when no such request runs (read on its first step)
    now: int | None = None  # what the engine's thread steps with now
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request_id: str, page: str | None) -> bool:
        """A page at address `page` draws the request (it sent it, or watches it; None: no page, an
        API client's) -> whether that page is on this machine (then drop() it when it stops watching)."""
        if page is None or not is_loopback(page):
            return False
        with self.lock:
            self.local[request_id] = self.local.get(request_id, 0) + 1
        return True

    def drop(self, request_id: str) -> None:
        """A local page stopped watching the request (it may run on)."""
        with self.lock:
            n = self.local.get(request_id, 0)
            if n > 1:
                self.local[request_id] = n - 1
            else:
                self.local.pop(request_id, None)

    def before_step(self, running: set[str]) -> int:
        """On the engine's thread, before a step: its threads set for the step (running: the
        live requests; the others drop out) -> the count."""
        if self.full is None:
            self.full = self.now = torch.get_num_threads()
        with self.lock:
            if self.local:
                self.local = {rid: n for rid, n in self.local.items() if rid in running}
            want = max(1, self.full - 1) if self.local else self.full
        if want != self.now:
            torch.set_num_threads(want)
            self.now = want
        return want
