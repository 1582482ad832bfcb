"""What is still alive of the processes a test started, read from /proc (Linux)."""
from __future__ import annotations

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
