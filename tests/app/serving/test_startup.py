"""`python -m app` start-up, as a user runs it: a broken checkpoint stops it with one clear
line (no traceback); --share without internet says so at once and the local server keeps
serving."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from tests.paths import ROOT



def env(tmp: Path) -> dict:
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    return {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HOME": str(home), "GRADIO_TEMP_DIR": str(tmp),
            "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TOKENTRACE_API_KEY": ""}


@pytest.fixture(scope="module")
def broken(checkpoint, tmp_path_factory) -> dict[str, list[str]]:
    """name -> the CLI arguments of one broken start-up."""
    from tests.tiny import make_checkpoint
    good = checkpoint("mixtral")
    root = tmp_path_factory.mktemp("broken")

    def copy(name: str) -> Path:
        return Path(shutil.copytree(good, root / name))

    truncated = copy("truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    header = copy("header")
    (header / "model.safetensors").write_bytes(b"\x08\x00\x00")
    arch = copy("arch")
    cfg = json.loads((arch / "config.json").read_text())
    (arch / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    remote = copy("remote")  # a checkpoint that needs its own code: never run, refused by name
    (remote / "config.json").write_text(json.dumps({**cfg, "architectures": ["EvilForCausalLM"],
                                                    "auto_map": {"AutoModelForCausalLM": "evil.EvilForCausalLM"}}))
    (remote / "evil.py").write_text("raise SystemExit('remote code ran')\n")
    draft = make_checkpoint("llama", root / "other_vocab", words=["</s>", "a", "b", "c"])
    return {
        "truncated": ["--model", str(truncated)],
        "header": ["--model", str(header)],
        "arch": ["--model", str(arch)],
        "remote": ["--model", str(remote)],
        "draft": ["--model", str(good), "--draft", str(draft)],
        "missing": ["--model", str(root / "nowhere")],
    }


EXPECT = {  # what the one line must say
    "truncated": "corrupt or truncated", "header": "corrupt or truncated", "arch": "unsupported architecture",
    "remote": "unsupported architecture", "draft": "vocabulary", "missing": "not found",
}


@pytest.mark.slow  # a `python -m app` process per case
def test_broken_checkpoints_fail_with_one_clear_line(broken, tmp_path):
    def run(name: str) -> tuple[str, subprocess.CompletedProcess]:
        return name, subprocess.run([sys.executable, "-m", "app", *broken[name], "--port", "1"], cwd=ROOT,
                                    env=env(tmp_path), capture_output=True, text=True, timeout=180)
    with ThreadPoolExecutor(2) as pool:
        results = dict(pool.map(run, EXPECT))
    for name, done in results.items():
        assert done.returncode != 0, name
        assert "Traceback" not in done.stderr and "remote code ran" not in done.stderr + done.stdout, name
        lines = [line for line in done.stderr.splitlines() if line.startswith("cannot start:")]
        assert len(lines) == 1 and EXPECT[name] in lines[0], (name, done.stderr[-2000:])
        assert done.stderr.rstrip().endswith(lines[0])  # the last word is the reason


def test_no_remote_code_anywhere():
    sources = [p for d in ("engine", "app") for p in (ROOT / d).rglob("*.py")]
    assert sources and not [p for p in sources if "trust_remote_code=True" in p.read_text()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # a `python -m app` process
def test_share_without_internet_keeps_serving_locally(checkpoint, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "app", "--model", str(checkpoint("mixtral")), "--share",
                             "--port", str(port)], cwd=ROOT, env=env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(line.startswith("--share:") for line in lines):
            assert proc.poll() is None, "".join(lines)
            time.sleep(0.1)
        share = [line for line in lines if line.startswith("--share:")]
        assert len(share) == 1, "".join(lines)
        # This machine has no internet: one line says so (with internet it prints the link)
        assert "could not create a public link" in share[0] or "public link https://" in share[0]
        assert any(line.startswith("public mode:") for line in lines)  # --share turns the caps on
        health = None
        while time.monotonic() < deadline and health is None:  # the line may come before the port is bound
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30)
            except httpx.ConnectError:
                time.sleep(0.2)
        assert health is not None and health.status_code == 200 and health.json()["status"] == "ok"
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)
