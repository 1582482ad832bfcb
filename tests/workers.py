"""How many xdist workers `-n auto` (pytest.ini) starts: one more than the cores, so the CPU
stays busy while a worker waits (a browser drawing, a served app starting, a throttled phone
page), at most one per 3 GiB of memory (a module may hold a real model and transformers'
copy of it) and at most 8. PYTEST_XDIST_AUTO_NUM_WORKERS overrides it. Two more than the
cores was slower on 2 cores (CI 2026-12-06: 13.8 min and 20.7 CPU minutes against 11.8 and
17.5 with three workers): more threads than cores spin at the kernels' barriers."""
from __future__ import annotations

import os

GIB_A_WORKER = 3
MOST = 8


def memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def auto_workers() -> int:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").isdigit():
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    cores = len(os.sched_getaffinity(0))
    return max(1, min(cores + 1, int(memory_gib() // GIB_A_WORKER), MOST))
