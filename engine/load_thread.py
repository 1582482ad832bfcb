"""Build what loads a model on a thread of its own, which then exits, so that the thread that
steps the engine is the only one with OpenMP workers.

GNU OpenMP (libgomp, which torch's CPU build and the C kernels share) keeps a pool of worker
threads for each thread that has entered a parallel region, for as long as that thread lives.
When it manages more threads than there are CPUs, its workers stop spinning between regions
almost at once (GOMP's throttled spin count) and sleep, so every parallel region pays a
wake-up. A server that loads its model on the main thread (the load's torch ops: a pool
there) and steps it on a thread of its own (a second pool) paid that on every matrix of every
step: on 2 CPUs the embedded MoE's served stream ran at 645 tokens/s against 3,031 loaded off
the main thread, and SmolLM2's at 54 against 67 (2026-12-07, untraced, batch 1). A pool goes
with its thread, so a load on a thread that ends leaves the stepping thread's pool alone.
(Two engines stepped on two threads still share the CPUs' workers this way: each their own
pool.)"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def on_own_thread(make: Callable[[], T], name: str = "tokentrace-load") -> T:
    """make() run on a new thread, waited for -> what it returned; what it raised is raised here.
    The thread is a daemon: a Ctrl-C while it loads ends the wait, and the process with it."""
    done: dict[str, object] = {}

    def run() -> None:
        try:
            done["value"] = make()
        except BaseException as e:  # (handed to the caller's thread: KeyboardInterrupt and SystemExit too)
            done["error"] = e

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if "error" in done:
        raise done["error"]
    return done["value"]
