"""Issue 15, bounded in CI: 100 audience clients (half English, half Chinese: issue 42) follow a
presenter for 15 s on loopback (the server in its own process, as `python -m benchmarks.hall_load`
runs it) while a streaming request runs and every client votes on the question: no errors, every
client shows every move, every vote counted once. How fast (lag, state p99, the stream's speed against solo) is
the benchmark's to hold, not a test's on a shared machine: `python -m benchmarks.hall_load`
(300 clients against benchmarks.hall_load.BAR); the test prints its trial's line."""
from __future__ import annotations

import asyncio
import signal
import time

import pytest

from benchmarks.hall_load import Conn, Hall, start_server, trial

pytestmark = pytest.mark.slow  # a load test: 100 clients for 15 s, the server in its own process


@pytest.fixture(scope="module")
def hall(checkpoint):
    proc, url = start_server(["--model", str(checkpoint("mixtral")), "--block-size", "4", "--num-kv-blocks", "64"])
    try:
        h = Hall(url, max_tokens=32, langs=("en", "zh-CN"))  # a hall of two languages: each built once
        h.proc = proc
        yield h
    finally:
        proc.terminate()
        proc.wait(10)


def test_100_clients_follow_every_move_and_vote_while_a_stream_runs(hall):
    async def go():
        await hall.make_room()
        return await trial(hall, 100, 15.0, every=1.5, votes=True)
    t = asyncio.run(go())
    print(t.line())
    assert t.errors == 0, t.error_kinds
    assert t.moves >= 9 and t.missed == 0 and t.missed_views == 0
    assert t.stage_fetches >= 100 * (t.moves + 1)  # each client fetched each stage it was moved to
    assert t.stream_tps_loaded > 0 and t.stream_tps_solo > 0, t.line()  # the stream ran beside the hall
    # the presenter asked at the sampling stage: every client voted once, the room counted each once
    assert t.questions >= 1 and t.votes_sent == 100 * t.questions == t.votes_counted


def test_ctrl_c_ends_the_server_while_followers_are_connected(hall):
    """Open event streams must not hold the server's exit (uvicorn waits for open responses)."""
    async def connect() -> list[Conn]:
        if not hall.room:
            await hall.make_room()
        conns = [Conn(hall.host, hall.port) for _ in range(3)]
        for c in conns:
            await c.send("GET", f"/classroom/{hall.room}/events")
            assert (await c.head())[0] == 200
        return conns

    async def run() -> float:
        conns = await connect()
        t = time.monotonic()
        hall.proc.send_signal(signal.SIGINT)
        while hall.proc.poll() is None and time.monotonic() - t < 30:
            await asyncio.sleep(0.1)
        for c in conns:
            c.close()
        return time.monotonic() - t
    took = asyncio.run(run())
    assert hall.proc.returncode == 0 and took < 15, took
