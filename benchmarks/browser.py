"""Headless Chromium for the page's own checks (tests, measurement): the system
browser (Debian's `chromium` package), never a downloaded build."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def find_chromium() -> str | None:
    for candidate in (os.environ.get("TOKENTRACE_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def launch(playwright, executable: str | None = None, extra_args: list[str] | None = None):
    path = executable or find_chromium()
    if path is None:
        raise FileNotFoundError("no Chromium found: apt-get install -y chromium")
    return playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS + (extra_args or []))


def chromium_memory_mb(root_pid: int | None = None) -> float:
    """Proportional set size (PSS, shared pages split fairly) of every Chromium process
    below root_pid (default: this process), in MiB."""
    root_pid = root_pid or os.getpid()
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            names[int(d.name)] = stat[stat.index("(") + 1:stat.rindex(")")]
            parents[int(d.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            continue

    def below(pid: int) -> bool:
        seen = 0
        while pid in parents and seen < 64:
            pid = parents[pid]
            if pid == root_pid:
                return True
            seen += 1
        return False

    total_kb = 0
    for pid, name in names.items():
        if "chrom" not in name.lower() or not below(pid):
            continue
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
                    break
        except OSError:
            continue
    return total_kb / 1024
