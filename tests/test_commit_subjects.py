"""The house's habit for history (issue 37, item 8): a commit's subject is at most 72
characters, its detail in the body. Held for the commits since the one below (the older
ones cannot be rewritten); skipped where there is no git history to read (an archive, a
shallow clone that lacks that commit)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.paths import ROOT

SINCE = "e5124490b2378dd9d1ddc618b1dcea3e674968e8"  # main when the rule began
MAX_SUBJECT = 72


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)


def test_commit_subjects_are_short():
    if shutil.which("git") is None or _git("cat-file", "-e", f"{SINCE}^{{commit}}").returncode != 0:
        pytest.skip("no git history with the rule's first commit here")
    log = _git("log", "--format=%h %s", f"{SINCE}..HEAD")
    assert log.returncode == 0, log.stderr
    long = [line for line in log.stdout.splitlines() if len(line.split(" ", 1)[1]) > MAX_SUBJECT]
    assert long == [], f"subjects over {MAX_SUBJECT} characters (the detail goes in the body):\n" + "\n".join(long)
