"""kill -9 during a burst of streamed requests: what had ended and was listed is in the file,
whole; what had not ended is missing (or marked interrupted at the next start); the file
passes integrity_check; and a trace that survived loads from the database for `--replay ID`
(no model)."""
from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time

import httpx
import pytest

from app.__main__ import library_of, parse_args, replay_recording
from tests.paths import ROOT

SHORT, LONG = 4, 6  # requests that end at once, and ones still streaming at the kill


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(args: list[str], tmp_path) -> tuple[subprocess.Popen, str]:
    port = _port()
    env = {**os.environ, "HOME": str(tmp_path), "GRADIO_TEMP_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1",
           "TOKENTRACE_API_KEY": ""}
    proc = subprocess.Popen([sys.executable, "-m", "app", *args, "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url, end = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("the server did not start")


def _stream(url: str, words: str, max_tokens: int, seen: dict) -> None:
    body = {"messages": [{"role": "user", "content": words}], "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0, "trace_level": "full" if max_tokens < 10 else "basic"}
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    seen.setdefault(words, {"id": json.loads(line[6:])["id"], "chunks": 0})["chunks"] += 1
                elif line == "data: [DONE]":
                    seen[words]["done"] = True
    except httpx.HTTPError:  # the kill
        pass


@pytest.mark.slow  # a `python -m app` process
def test_kill_9_mid_burst_keeps_what_ended_and_a_sound_file(checkpoint, tmp_path):
    db = tmp_path / "traces.db"
    model = ["--model", str(checkpoint("llama")), "--draft", "none", "--max-num-seqs", "16"]
    proc, url = _serve([*model, "--db", str(db)], tmp_path)
    seen: dict = {}
    threads = [threading.Thread(target=_stream, args=(url, f"long {i}", 220, seen), daemon=True) for i in range(LONG)]
    threads += [threading.Thread(target=_stream, args=(url, f"short {i}", 3, seen), daemon=True) for i in range(SHORT)]
    try:
        for t in threads:
            t.start()
        end = time.monotonic() + 60
        while True:  # every short one ended and is listed (written a moment after its end), the long ones stream
            listed = {t["id"] for t in httpx.get(url + "/v1/traces", params={"limit": 100}).json()["data"]}
            shorts = [seen.get(f"short {i}", {}) for i in range(SHORT)]
            ended = [s for s in seen.values() if s.get("done")]  # a long one too may have ended by now
            if all(s.get("done") and s["id"] in listed for s in shorts) and len(seen) == LONG + SHORT and \
                    all(s["id"] in listed for s in ended):
                break
            assert time.monotonic() < end, (seen, listed)
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    for t in threads:
        t.join(timeout=30)
    cut = [seen[f"long {i}"]["id"] for i in range(LONG) if not seen[f"long {i}"].get("done")]
    assert cut, "every long request ended before the kill: the test did not kill mid-burst"

    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    states = dict(conn.execute("SELECT id, state FROM traces").fetchall())
    conn.close()
    for i in range(SHORT):
        assert states[seen[f"short {i}"]["id"]] == "done"
    assert all(states.get(rid) in (None, "running") for rid in cut), states  # only their start was written

    survivor = seen["short 0"]["id"]
    args = parse_args(["--replay", survivor, "--db", str(db)])  # the restart: no model, from the database
    library = library_of(None, args)
    rec = replay_recording(args.replay, library)
    assert rec.outputs[-1]["finished"] and len([o for o in rec.outputs if o["token_id"] >= 0]) == 3
    # every trace listed before the kill survived it; a long one that ended in the last moments (its
    # write still under way at the kill) may be missing, and none that never ended is there
    kept = {t["id"] for t in library.listed(100)[0]}
    assert listed <= kept <= {s["id"] for s in seen.values() if s.get("done")}
    assert {seen[f"short {i}"]["id"] for i in range(SHORT)} <= listed
    library.close()
    conn = sqlite3.connect(db)  # that start-up marked the cut ones
    assert {conn.execute("SELECT state FROM traces WHERE id = ?", (rid,)).fetchone()[0] for rid in cut} == \
        {"interrupted"}
    with pytest.raises(ValueError, match="no trace of that id"):
        replay_recording("chatcmpl-nope", library)
