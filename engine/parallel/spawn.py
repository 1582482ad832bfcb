"""Spawned processes that report once they are loaded: a tensor-parallel engine's worker
ranks, a disaggregated engine's prefill engines.

Each is a torch.multiprocessing process (the spawn method: a fresh interpreter, nothing
forked from a process that may hold CUDA or threads) with a pipe to its parent, whose child
end is the target's last argument. Once loaded, it sends (READY, info) on that pipe, or
(an error's name, its text) when loading failed; wait_loaded reads every such report, and
turns a process that exited, failed or said nothing in time into the caller's error.
"""
from __future__ import annotations

import time
from typing import Callable

import torch.multiprocessing as mp

from engine.parallel.protocol import READY


def start_process(target: Callable, args: tuple, name: str, procs: list, conns: list) -> None:
    """Start target(*args, conn) as a daemon process: it joins `procs`, its pipe's parent end
    `conns` (the caller's lists, which its finalizer may already hold)."""
    ctx = mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    p = ctx.Process(target=target, args=(*args, child_conn), daemon=True, name=name)
    p.start()
    child_conn.close()  # the child's copy is its own: a child that dies closes the pipe
    procs.append(p)
    conns.append(parent_conn)


def wait_loaded(procs: list, conns: list, timeout_s: float, error: type[Exception], exited: str, failed: str,
               first: int = 0, per_process: bool = False) -> list:
    """Each process's report, in order -> the info each sent with READY. `exited` and `failed`
    name what went wrong ({n}: the process's number, counted from `first`): "<exited> (exit
    code N)" for a process that ended or was silent past the deadline, "<failed>: <why>" for
    one that reported an error. The deadline is timeout_s for all of them, or each
    (per_process: the next one's clock starts once one is ready)."""
    infos = []
    deadline = time.monotonic() + timeout_s
    for i, (p, conn) in enumerate(zip(procs, conns)):
        n = i + first
        if per_process:
            deadline = time.monotonic() + timeout_s
        while not conn.poll(0.1):
            if not p.is_alive() or time.monotonic() > deadline:
                raise error(f"{exited.format(n=n)} (exit code {p.exitcode})")
        try:
            status, info = conn.recv()
        except (EOFError, OSError):  # it ended without a word: its pipe closed
            p.join(5)
            raise error(f"{exited.format(n=n)} (exit code {p.exitcode})") from None
        if status != READY:
            raise error(f"{failed.format(n=n)}: {info}")
        infos.append(info)
    return infos


def check_alive(procs: list, error: type[Exception], exited: str, first: int = 0) -> None:
    """While the process group connects: a process that is gone will never join it, so the
    caller's error now ("<exited> (exit code N)", {n} the process's number from `first`)."""
    for i, p in enumerate(procs):
        if not p.is_alive():
            raise error(f"{exited.format(n=i + first)} (exit code {p.exitcode})")
