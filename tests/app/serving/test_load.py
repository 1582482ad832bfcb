"""Load on loopback: 32 concurrent streaming clients all finish, each greedy answer equals
the one its prompt gets alone, and the KV pool ends as it began; with a pool far too small
for the load, requests wait or are preempted and still finish with the same answers.
Bounded in count; the only time limits are generous timeouts against hangs."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.service_utils import app_service, served

pytestmark = pytest.mark.slow  # load tests: dozens of concurrent streams
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    with served(app_service(checkpoint, "--block-size", "4", "--max-num-seqs", "16"), tmp_path_factory) as srv:
        yield srv


@pytest.fixture(scope="module")
def small_pool(checkpoint, tmp_path_factory):
    # 14 blocks x 4 tokens: room for about two of these requests at once, 8 may run
    svc = app_service(checkpoint, "--block-size", "4", "--num-kv-blocks", "14", "--max-num-seqs", "8",
                      "--max-num-batched-tokens", "16")
    with served(svc, tmp_path_factory) as srv:
        yield srv


def prompt(i: int) -> str:
    return f"Request {i}: the quick brown fox" + " jumps" * (i % 5)


def stream(url: str, text: str) -> str:
    body = {"stream": True, "temperature": 0, "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "messages": [{"role": "user", "content": text}]}
    parts, done = [], False
    with httpx.stream("POST", url + "v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                parts.append(chunk["choices"][0]["delta"].get("content") or "")
    assert done
    return "".join(parts)


def pool_state(server):
    from app.serving.engine_service import wait_idle
    engine = server.service.engine
    assert wait_idle(server.service, timeout=60)
    with engine.lock:
        bm = engine.block_manager
        bm.check_invariants([])
        return bm.num_free_blocks, bm.num_blocks


def run_concurrently(server, texts: list[str]) -> list[str]:
    with ThreadPoolExecutor(len(texts)) as pool:
        return list(pool.map(lambda t: stream(server.url, t), texts, timeout=300))


def test_32_concurrent_streams_each_equal_to_alone(server):
    free0, total = pool_state(server)
    assert free0 == total
    texts = [prompt(i) for i in range(32)]
    alone = [stream(server.url, t) for t in texts]  # one at a time
    assert pool_state(server) == (total, total)
    watch = server.service.subscribe_all()  # to see how many requests shared the engine's steps
    try:
        together = run_concurrently(server, texts)
    finally:
        server.service.unsubscribe(watch)
    assert together == alone
    assert pool_state(server) == (total, total)  # every block back (cached prefixes count as free)
    assert server.service.slots._count == {}
    steps = [e for e in watch.drain(0) if e.get("type") == "schedule.step"]
    assert max(len(s["batch"]) for s in steps) > 1  # the load really was concurrent


def test_an_exhausted_pool_makes_requests_wait_or_be_preempted_and_still_finish(small_pool):
    texts = [prompt(i) for i in range(12)]
    alone = [stream(small_pool.url, t) for t in texts]
    watch = small_pool.service.subscribe_all()
    try:
        together = run_concurrently(small_pool, texts)
    finally:
        small_pool.service.unsubscribe(watch)
    assert together == alone
    events = watch.drain(0)
    preempted = sum(1 for e in events if e.get("type") == "schedule.preempt")
    # waiting with free batch slots (8) means waiting for KV blocks
    short_of_blocks = sum(1 for e in events if e.get("type") == "schedule.step" and e["waiting"] and e["running"] < 8)
    assert preempted + short_of_blocks > 0, "the small pool never ran out"
    free, total = pool_state(small_pool)
    assert free == total
