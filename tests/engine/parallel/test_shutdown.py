"""A sharded engine's shutdown leaves nothing behind: no worker process, and no named
semaphore for Python's resource tracker to find ("There appear to be N leaked semaphore
objects to clean up at shutdown"), after a clean shutdown and after a rank died.

Each case runs in a process of its own (the tracker speaks when that process exits), in its
own process group, so that whatever it started can be found afterwards.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.paths import ROOT
from tests.processes import group_members

pytestmark = pytest.mark.slow  # a process per case, each with 2 worker ranks

SCRIPT = textwrap.dedent("""
    import json, multiprocessing, os, signal, sys
    sys.path.insert(0, {root!r})
    from engine import LLM, SamplingParams
    from engine.parallel.runner import RankFailedError
    from tests.processes import children

    if __name__ == "__main__":
        llm = LLM({path!r}, device="cpu", dtype="float32", block_size=4, tensor_parallel_size=2)
        greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        llm.generate([1, 2, 3], greedy)
        workers = list(llm.engine.runner.procs)
        if {kill_rank!r}:
            os.kill(workers[0].pid, signal.SIGKILL)
            workers[0].join(5)
            try:
                llm.generate([1, 2, 3], greedy)
                sys.exit("rank 0 did not notice rank 1's death")
            except RankFailedError:
                pass
        llm.shutdown()
        print(json.dumps({{"pids": [p.pid for p in workers], "active": len(multiprocessing.active_children()),
                          "children": children(os.getpid())}}), flush=True)
""")


@pytest.mark.parametrize("kill_rank", [False, True], ids=["clean", "rank-killed"])
def test_shutdown_leaves_no_process_and_no_semaphore(checkpoint, tmp_path, kill_rank):
    script = tmp_path / "serve.py"
    script.write_text(SCRIPT.format(root=str(ROOT), path=str(checkpoint("llama")), kill_rank=kill_rank))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env={**os.environ, "TQDM_DISABLE": "1"})
    try:
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    assert p.returncode == 0, err[-3000:]
    after = json.loads(out.strip().splitlines()[-1])
    # right after shutdown(): the workers are reaped; the only child left is multiprocessing's
    # resource tracker, which lives as long as the engine's process
    assert after["active"] == 0 and len(after["pids"]) == 1
    assert all("resource_tracker" in c for c in after["children"]), after["children"]
    assert "leaked semaphore" not in err and "resource_tracker" not in err, err[-3000:]
    # the resource tracker ends when it reads its pipe's end, just after the engine's process:
    # give it a moment, then nothing of the group may be left
    deadline = time.monotonic() + 10
    while group_members(p.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert group_members(p.pid) == [], "a process outlived the engine's process"
