"""The torchrun entry point (engine/parallel/torchrun.py): 2 processes on this CPU over gloo.

torchrun starts both ranks; rank 0 builds the sharded engine without spawning, rank 1
serves it. The greedy completion must equal the single-device engine's (itself checked
against transformers in test_parity.py), and every process torchrun started must be gone
when it returns, on success and on failure.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.parallel.rendezvous import TorchrunEnv, check_world
from tests.paths import ROOT
from tests.processes import group_members

EMBEDDED = ROOT / "assets" / "models" / "target"
TIMEOUT_S = 150


def _start(*args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "engine.parallel.torchrun", *args]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "TQDM_DISABLE": "1"})


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --standalone --nproc-per-node 2 -m engine.parallel.torchrun ARGS`,
    in its own process group; afterwards no process of that group may be left."""
    p = _start(*args)
    try:
        out, err = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        pytest.fail(f"torchrun did not finish in {TIMEOUT_S} s:\n{err[-3000:]}")
    assert group_members(p.pid) == [], "processes left behind by torchrun"
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.mark.slow  # torchrun: 2 processes
def test_generate_on_two_torchrun_ranks_matches_one_device():
    prompt, n = "Once upon a time, the little fox", 12
    r = _torchrun("generate", "--model", str(EMBEDDED), "--prompt", prompt, "--max-tokens", str(n))
    assert r.returncode == 0, r.stderr[-3000:]  # torchrun's code: every rank exited 0 (rank 1 after the goodbye)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    with LLM(EMBEDDED, device="cpu", dtype="float32") as one:
        want = one.generate([prompt], SamplingParams(temperature=0, max_tokens=n))[0]
    assert got["world_size"] == 2
    assert got["token_ids"] == want.token_ids and len(want.token_ids) == n
    assert got["text"] == want.text
    # rank 1 held half the heads, and finished on rank 0's goodbye
    assert "tokentrace rank 1/2: serving target (engine 0, " in r.stderr
    assert "tokentrace rank 1/2: rank 0 finished; exiting" in r.stderr


@pytest.mark.slow  # torchrun: 2 processes
@pytest.mark.parametrize("args,message", [
    (("generate", "--model", "/nonexistent/model", "--prompt", "hi"), "model directory not found: /nonexistent/model"),
    (("app", "--tensor-parallel-size", "3"), "tensor_parallel_size=3 but torchrun started WORLD_SIZE=2 processes"),
], ids=["bad-model", "world-size-mismatch"])
def test_refusals_stop_every_rank_with_one_message(args, message):
    r = _torchrun(*args)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.startswith("cannot start:")]
    assert len(lines) == 1 and message in lines[0], r.stderr[-3000:]


def test_only_rank_zero_builds_the_engine(monkeypatch):
    env = TorchrunEnv(rank=1, world_size=2, local_rank=1, local_world_size=2, master_addr="127.0.0.1", master_port=1)
    with pytest.raises(ValueError, match="only rank 0 builds the sharded engine"):
        check_world(env, 2)
    # a script under torchrun that builds a sharded LLM on every rank is refused on rank 1
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match="this is rank 1"):
        LLM(EMBEDDED, device="cpu", dtype="float32", tensor_parallel_size=2)


def _free_port() -> int:
    """A free port below the kernel's ephemeral range. A port found by binding to 0 is an
    ephemeral one, and while the app starts torchrun's rendezvous and gloo bind ephemeral
    ports of their own, which can take it first (seen in CI: "address already in use")."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            first_ephemeral = int(f.read().split()[0])
    except OSError:
        first_ephemeral = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, first_ephemeral - 10000), first_ephemeral)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def _complete(port: int, model: str) -> dict:
    body = json.dumps({"model": model, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body.encode(),
                                 {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=30).read())


def _first_answer(p: subprocess.Popen, port: int, model: str, log: Path) -> dict:
    """The app's first completion (polling while it starts)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and p.poll() is None:
        try:
            return _complete(port, model)
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"the app did not answer (torchrun exit code {p.poll()}):\n{log.read_text()[-3000:]}")


def _app(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, int, Path]:
    """torchrun ... app ARGS on a free port, its output in a file (a pipe nobody reads could fill)."""
    port, log = _free_port(), tmp_path / "torchrun.log"
    with open(log, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                              "-m", "engine.parallel.torchrun", "app", *args, "--port", str(port), "--dtype", "float32",
                              "--device", "cpu"], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True, env={**os.environ, "TQDM_DISABLE": "1"})
    return p, port, log


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None or group_members(p.pid):
        os.killpg(p.pid, 9)
        p.wait()


@pytest.mark.slow  # torchrun: 2 processes
def test_app_on_two_torchrun_ranks_answers_and_stops_on_ctrl_c(tmp_path):
    """`torchrun ... -m engine.parallel.torchrun app` with two models (two sharded engines, each
    served by rank 1 on its own thread): the OpenAI API answers what one device answers, for
    both; Ctrl-C (SIGINT to torchrun, which passes it on) stops every process."""
    p, port, log = _app(tmp_path, "--model", str(EMBEDDED), "--served-model-name", "a",
                        "--model", str(EMBEDDED), "--served-model-name", "b")
    try:
        answer = _first_answer(p, port, "a", log)
        with LLM(EMBEDDED, device="cpu", dtype="float32") as one:
            want = one.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=8))[0]
        assert answer["choices"][0]["text"] == want.text
        assert _complete(port, "b")["choices"][0]["text"] == want.text
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
        time.sleep(0.5)
        assert group_members(p.pid) == [], "processes left behind by torchrun"
        out = log.read_text()
        assert "tokentrace rank 1/2: serving target (engine 0, " in out
        assert "tokentrace rank 1/2: serving target (engine 1, " in out
        assert "tokentrace rank 1/2: rank 0 finished; exiting" in out  # rank 0 stopped cleanly, then rank 1
    finally:
        _stop(p)


def _rank_pid(torchrun_pid: int, rank: int) -> int:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                env = d.joinpath("environ").read_bytes().split(b"\0")
                ppid = int(d.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
            if ppid == torchrun_pid and f"RANK={rank}".encode() in env:
                return int(d.name)
    raise AssertionError(f"no rank {rank} under torchrun {torchrun_pid}")


@pytest.mark.slow  # torchrun: 2 processes
def test_a_killed_rank_stops_every_process(tmp_path):
    """Rank 1 killed while the app serves: torchrun stops rank 0 and exits non-zero naming
    rank 1; no process is left, no hang."""
    p, port, log = _app(tmp_path, "--model", str(EMBEDDED))
    try:
        _first_answer(p, port, "target", log)
        os.kill(_rank_pid(p.pid, 1), signal.SIGKILL)
        assert p.wait(timeout=60) != 0
        time.sleep(0.5)
        assert group_members(p.pid) == [], "processes left behind by torchrun"
        assert "local_rank: 1" in log.read_text() and "exitcode: -9" in log.read_text()
    finally:
        _stop(p)
