"""What is still alive of the processes a test started, read from /proc (Linux); stand-ins for
a spawned rank that ends early; a call that must end in time."""
from __future__ import annotations

import os
import threading
from pathlib import Path


def _live() -> list[tuple[int, list[str]]]:
    """(pid, the fields of /proc/pid/stat after the command name) of every live, not zombie, process."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = d.joinpath("stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z":
                out.append((int(d.name), fields))
    return out


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group (a Popen with start_new_session=True leads its own)."""
    return [pid for pid, fields in _live() if int(fields[2]) == pgid]


def children(pid: int) -> list[str]:
    """The command lines of pid's live children."""
    out = []
    for child, fields in _live():
        if int(fields[1]) == pid:
            try:
                out.append(Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return out


# --- stand-ins for a spawned rank's entry point (torch.multiprocessing spawn imports them by name) ---
def exit_at_once(*args) -> None:
    """A rank whose process ends before it joins the process group (Ctrl-C during its start-up, a crash)."""
    os._exit(1)


def started_then_gone(spec, parent: int, conn) -> None:
    """A prefill process that answers the start-up, then ends before it joins the process group."""
    from engine.parallel.protocol import READY

    conn.send((READY, {"num_blocks": 64}))
    os._exit(1)


def raised_within(seconds: float, fn) -> BaseException | None:
    """What fn() raised (None: it returned), or AssertionError where it is still running after
    `seconds` (it runs on a daemon thread, left behind: a hang fails the test, never holds it)."""
    out: list = []

    def run() -> None:
        try:
            fn()
            out.append(None)
        except BaseException as e:  # noqa: BLE001 - the caller asserts on it
            out.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"still running after {seconds:.0f} s"
    return out[0]
