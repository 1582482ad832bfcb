"""A client that goes away mid-stream aborts its request and frees its KV blocks."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.service_utils import app_service, served


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    # paced: slow enough that the stream is still running when the client leaves
    with served(app_service(checkpoint, "--block-size", "4", pace_s=0.02), tmp_path_factory) as srv:
        yield srv


@pytest.fixture
def aborts(server):
    """Each abort as (engine step when it was called, free blocks when it returned): the
    blocks are freed inside the abort, not by a later step."""
    engine = server.service.engine
    abort, seen = engine.abort, []

    def recording_abort(request_id):
        with engine.lock:  # no step can run between the abort and the count
            done = abort(request_id)
            if done:
                seen.append((engine.step_count, engine.block_manager.num_free_blocks))
            return done
    engine.abort = recording_abort
    yield seen
    engine.abort = abort


def wait_for_abort(engine, aborted: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (engine.has_unfinished_requests() or engine.num_aborted == aborted):
        time.sleep(0.01)
    assert engine.num_aborted == aborted + 1 and not engine.has_unfinished_requests()
    bm = engine.block_manager
    with engine.lock:
        bm.check_invariants([])
        assert bm.num_free_blocks == bm.num_blocks


BODY = {"stream": True, "max_tokens": 200, "ignore_eos": True, "temperature": 0,  # prompt + 200 fit the context
        "messages": [{"role": "user", "content": "Keep talking for a long time"}]}


def test_streaming_client_disconnect_aborts_and_frees_blocks(server):
    engine = server.service.engine
    aborted = engine.num_aborted
    with httpx.stream("POST", server.url + "v1/chat/completions", json=BODY, timeout=30) as r:
        lines = r.iter_lines()
        data = [line for line in (next(lines) for _ in range(8)) if line.startswith("data: ")]
        assert len(data) >= 3
        assert engine.has_unfinished_requests()
    wait_for_abort(engine, aborted, timeout=60)
    assert engine.stats.generated_tokens < 200  # it stopped long before max_tokens


def test_http_disconnect_frees_blocks_within_an_engine_step(server, aborts):
    engine = server.service.engine
    aborted, total = engine.num_aborted, engine.block_manager.num_blocks
    with httpx.stream("POST", server.url + "v1/chat/completions", json=BODY, timeout=30) as r:
        lines = r.iter_lines()
        assert sum(1 for line in (next(lines) for _ in range(8)) if line.startswith("data: ")) >= 3
        closed_at = engine.step_count
    wait_for_abort(engine, aborted)
    (step, free), = aborts
    assert free == total  # freed by the abort itself
    # The server notices the closed socket at once; steps here take >= 20 ms, so a bound of
    # a few steps is generous and still far below the 200 the request asked for.
    assert step - closed_at <= 5, (closed_at, step)


def test_websocket_client_that_leaves_aborts_its_request(server, aborts):
    from websockets.sync.client import connect
    engine = server.service.engine
    aborted, total = engine.num_aborted, engine.block_manager.num_blocks
    # max_queue=None: unread events must not hold up the client's side of the close handshake
    with connect(server.url.replace("http://", "ws://") + "ws?request_id=none-yet", max_queue=None) as ws:
        ws.send(json.dumps(BODY))
        first = json.loads(ws.recv(timeout=30))
        assert first["type"] == "request.submitted"
        rid, outputs = first["request_id"], 0
        while outputs < 3:  # the socket carries its own request's events and text
            item = json.loads(ws.recv(timeout=30))
            assert item["request_id"] == rid or any(b["request_id"] == rid for b in item.get("batch", ())) or \
                rid in item.get("request_ids", ())  # its own, its batches, the pool while it runs
            outputs += item["type"] == "output"
        assert engine.has_unfinished_requests()
        closed_at = engine.step_count
    wait_for_abort(engine, aborted)
    (step, free), = aborts
    assert free == total and step - closed_at <= 5, (closed_at, step)
    assert rid in server.service.store  # its trace (up to the abort) is kept
