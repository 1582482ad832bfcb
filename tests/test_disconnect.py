"""A client that goes away mid-stream aborts its request and frees its KV blocks."""
from __future__ import annotations

import os
import time

import httpx
import pytest


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    os.environ.setdefault("GRADIO_TEMP_DIR", str(tmp_path_factory.mktemp("gradio")))
    from app.__main__ import build_service, parse_args
    from app.local_server import LocalServer
    svc = build_service(parse_args(["--model", str(checkpoint("mixtral")), "--block-size", "4"]))
    step = svc.engine.step

    def paced_step():  # slow enough that the stream is still running when the client leaves
        time.sleep(0.02)
        return step()
    svc.engine.step = paced_step
    with LocalServer(svc) as srv:
        yield srv


def test_streaming_client_disconnect_aborts_and_frees_blocks(server):
    engine = server.service.engine
    aborted = engine.num_aborted
    body = {"stream": True, "max_tokens": 400, "ignore_eos": True, "temperature": 0,
            "messages": [{"role": "user", "content": "Keep talking for a long time"}]}
    with httpx.stream("POST", server.url + "v1/chat/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        data = [line for line in (next(lines) for _ in range(8)) if line.startswith("data: ")]
        assert len(data) >= 3
        assert engine.has_unfinished_requests()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (engine.has_unfinished_requests() or engine.num_aborted == aborted):
        time.sleep(0.05)
    assert engine.num_aborted == aborted + 1 and not engine.has_unfinished_requests()
    bm = engine.block_manager
    with engine.lock:
        bm.check_invariants([])
        assert bm.num_free_blocks == bm.num_blocks
    assert engine.stats.generated_tokens < 400  # it stopped long before max_tokens
