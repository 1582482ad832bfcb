"""What keeping traces in a database costs serving: streaming at capture level full through
the app's own service with the SQLite library on against `--db none`, runs interleaved; how
long one trace's write takes on the writer thread; and how fast a 500-token trace loads back
from the database for replay (the file read, parsed, and the replay's last frame drawn)."""
from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path

from app.__main__ import build_service, parse_args
from app.serving.recording import ReplayCursor, record_request
from app.serving.requests import parse_body
from app.store.library import Library
from app.store.opening import open_library
from benchmarks.bench.context import TEXT, Bench

REPLAY_TOKENS = 500


def _stream(svc, body: dict) -> tuple[str, float, float]:
    """One request to its end: (id, seconds from its first token to its last, tokens after the first)."""
    watch = svc.submit(parse_body(body))
    first = last = None
    n, ended, give_up = 0, False, time.monotonic() + 600
    while not ended and time.monotonic() < give_up:  # to the trace's end: its `finish` follows the lenses
        for item in watch.drain(0.05):
            if item.get("type") == "output" and item["request_id"] == watch.request_id:
                if item.get("token_id", -1) >= 0:
                    n += 1
                    first = first or time.perf_counter()
                if item["finished"]:
                    last = time.perf_counter()
            ended = ended or (item.get("type") == "finish" and item.get("request_id") == watch.request_id)
    svc.unsubscribe(watch)
    return watch.request_id, last - first, n - 1


def database(b: Bench) -> None:
    s = b.settings
    svc = build_service(parse_args(["--model", str(b.model), "--device", b.device, "--draft", "none",
                                    "--db", "none"])).start()
    folder = Path(tempfile.mkdtemp(prefix="tt-bench-db-"))
    on, off = open_library(svc.store, str(folder / "bench.db"), lambda line: None), Library(svc.store)
    on.recorder = lambda rid: record_request(svc.store, rid, svc.model_info(), svc.piece, svc.is_special)
    n = 2 * s.new_tokens
    words = TEXT[:300 if s.new_tokens >= 64 else 40]  # --quick: a tiny model's context

    def body(tokens: int) -> dict:
        return {"messages": [{"role": "user", "content": words}], "max_tokens": tokens, "ignore_eos": True,
                "temperature": 0, "trace_level": "full"}
    try:
        _stream(svc, body(4))  # warm-up
        rates: dict[str, list[float]] = {"db": [], "none": []}
        writes: list[float] = []
        order = random.Random(0)
        for _ in range(3 * s.repeats):
            for name in order.sample(list(rates), 2):
                svc.store.listener = on if name == "db" else off
                _, seconds, tokens = _stream(svc, body(n))
                rates[name].append(tokens / seconds)
                if name == "db":  # its write ends before the next run starts (timed apart below)
                    t = time.perf_counter()
                    on.writer.flush(60)
                    writes.append(time.perf_counter() - t)
        rate_db, rate_none = statistics.median(rates["db"]), statistics.median(rates["none"])
        b.add("trace database", "stream at level full, SQLite on: tok/s", rate_db, "tok/s", rate_none,
              f"baseline: --db none; ratio {rate_db / rate_none:.3f} (target >= 0.97); median of "
              f"{len(rates['db'])} interleaved runs of {n} tokens")
        b.add("trace database", "the write left after a request ends", statistics.median(writes) * 1e3, "ms",
              note="on the writer thread, after the stream ended: its file encoded, compressed, committed")
        svc.store.listener = on
        replay_tokens = REPLAY_TOKENS if s.new_tokens >= 64 else 4 * n  # --quick: a short one
        rid, _, _ = _stream(svc, body(replay_tokens))
        on.writer.flush(120)
        cold = open_library(None, str(folder / "bench.db"), lambda line: None)  # a restarted server: no memory
        t = time.perf_counter()
        rec = cold.recording(rid)
        cursor = ReplayCursor(rec)
        cursor.goto(cursor.last_frame)
        load = time.perf_counter() - t
        b.add("trace database", f"replay load of a {replay_tokens}-token full trace", load * 1e3, "ms",
              note=f"read, decompress, parse, replay to its last frame (target < 1000 ms); "
                   f"{cold.repo.meta(rid).nbytes / 2**20:.1f} MiB of JSON")
        cold.close()
    finally:
        on.close()
        svc.stop()
