"""How big a lecture hall one classroom holds: a bounded load test on loopback.

    python -m benchmarks.hall_load --clients 300 --seconds 20
    python -m benchmarks.hall_load --find-max --seconds 15

It starts the server (`python -m app`, its own process) unless --url names one, runs one
traced request and makes a room of it, then for --seconds: the presenter moves every
--move-every seconds through the stages; each of --clients audience clients does what the
audience page does (one server-sent event stream, and a stage's HTML fetched once per stage
and trace version, as a browser's cache would); one streaming API request runs again and
again meanwhile. It reports errors, state latency (presenter move -> the state reaching a
client) p50/p99, the worst lag (move -> the last client holding that stage's HTML), moves
some client never saw, and the stream's tokens/s against the same request alone.

--find-max grows the audience (doubling, then halving the gap, at most --max-trials runs; a
size that fails is run once more before it counts as failing) to the largest that meets the
hall's bar: no errors, every client sees every move, the last
client within 1 s, state p99 under 500 ms, the stream at 0.8 of its solo speed or better.
The clients are plain asyncio sockets (no HTTP library per client) so that the generator,
not being the thing measured, costs as little CPU as it can.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

from benchmarks.app_process import start_server

BAR = {"errors": 0, "missed": 0, "worst_lag_s": 1.0, "state_p99_ms": 500.0, "stream_ratio": 0.8}
MAX_CLIENTS = 2000  # bounds: loopback only, this many sockets at most, this long at most
MAX_SECONDS = 120


# --- a minimal HTTP/1.1 client (keep-alive, content-length or chunked) -------------------
class Conn:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=2**22)

    async def send(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> None:
        if self.writer is None:
            await self.open()
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
        await self.writer.drain()

    async def head(self) -> tuple[int, dict]:
        status = int((await self.reader.readline()).split()[1])
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        return status, headers

    async def chunks(self, headers: dict):
        """The body's pieces as they come (chunked) or at once (content-length)."""
        if headers.get("transfer-encoding") == "chunked":
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readline()
                    return
                data = await self.reader.readexactly(size)
                await self.reader.readexactly(2)
                yield data
        else:
            n = int(headers.get("content-length", 0))
            if n:
                yield await self.reader.readexactly(n)

    async def request(self, method: str, path: str, body: bytes | None = None,
                      headers: dict | None = None) -> tuple[int, dict, bytes]:
        await self.send(method, path, body, headers)
        status, hdrs = await self.head()
        data = b"".join([c async for c in self.chunks(hdrs)])
        if hdrs.get("connection") == "close":
            self.close()
        return status, hdrs, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


# --- one trial ---------------------------------------------------------------------
@dataclass
class Trial:
    clients: int
    seconds: float
    moves: int = 0
    errors: int = 0
    error_kinds: dict = field(default_factory=dict)
    state_p50_ms: float = 0.0
    state_p99_ms: float = 0.0
    join_p99_ms: float = 0.0  # connect -> first state (a late joiner or a reconnect resumes)
    worst_lag_s: float = 0.0  # presenter move -> the last client holding that stage's HTML
    lag_p50_s: float = 0.0
    missed: int = 0  # moves that some client never showed
    missed_views: int = 0  # (client, move) pairs never shown
    stage_fetches: int = 0
    questions: int = 0  # with --votes: questions opened, votes the clients sent, votes the room counted
    votes_sent: int = 0
    votes_counted: int = 0
    stream_tps_solo: float = 0.0  # the mean of the solo speed just before and just after
    stream_tps_solo_range: list = field(default_factory=list)
    stream_tps_loaded: float = 0.0
    stream_ratio: float = 0.0
    loadavg: list = field(default_factory=list)  # the machine's 1-min load at start and end

    def meets(self, bar: dict = BAR) -> bool:
        return (self.errors <= bar["errors"] and self.missed <= bar["missed"]
                and self.worst_lag_s <= bar["worst_lag_s"] and self.state_p99_ms < bar["state_p99_ms"]
                and self.stream_ratio >= bar["stream_ratio"])

    def line(self) -> str:
        return (f"{self.clients:5d} clients  errors {self.errors}  state p50/p99 {self.state_p50_ms:.0f}/"
                f"{self.state_p99_ms:.0f} ms  worst lag {self.worst_lag_s:.2f} s  missed {self.missed}/{self.moves}"
                f"  stream {self.stream_ratio:.2f} of solo ({self.stream_tps_loaded:.1f}/{self.stream_tps_solo:.1f}"
                f" tok/s)  load {self.loadavg[0]:.1f}->{self.loadavg[-1]:.1f}"
                + (f"  votes {self.votes_counted}/{self.votes_sent} in {self.questions} question(s)"
                   if self.questions else "") + f"  {'MEETS' if self.meets() else 'fails'}")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


class Hall:
    """The server under test: its address, one room, and the stream request's body."""

    def __init__(self, url: str, model: str | None = None, max_tokens: int = 32,
                 langs: tuple[str, ...] = ("en",)) -> None:
        u = urlsplit(url)
        if u.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit("hall_load runs on loopback only")
        self.host, self.port = u.hostname, u.port or 80
        self.model, self.max_tokens = model, max_tokens
        self.room = self.key = ""
        self.count, self.sample_stage = 0, -1
        self.langs = langs  # the followers' languages, in turn (each language's stages are built once)

    def body(self, stream: bool, trace_level: str = "basic") -> bytes:
        b = {"stream": stream, "max_tokens": self.max_tokens, "temperature": 0, "ignore_eos": True,
             "trace_level": trace_level, "messages": [{"role": "user", "content": "Why is the sky blue?"}]}
        if self.model:
            b["model"] = self.model
        return json.dumps(b).encode()

    async def make_room(self) -> None:
        c = Conn(self.host, self.port)
        status, _, data = await c.request("POST", "/v1/chat/completions", self.body(False, "full"))
        if status != 200:
            raise RuntimeError(f"the traced request failed: {status} {data[:300]!r}")
        rid = json.loads(data)["id"]
        status, _, data = await c.request("POST", "/classroom", json.dumps({"request_id": rid}).encode())
        if status != 200:
            raise RuntimeError(f"making the room failed: {status} {data[:300]!r}")
        room = json.loads(data)
        c.close()
        self.room, self.key, self.count = room["id"], room["presenter_url"].split("key=")[1], room["stages"]
        page = await Conn(self.host, self.port).request("GET", f"/classroom/{self.room}")
        # the room's page names its sampling stage in its settings (app/classroom/page.py)
        found = re.search(rb"const CONFIG = (\{.*?\});", page[2])
        self.sample_stage = json.loads(found.group(1))["sample"] if found else -1

    async def questions(self) -> list[dict]:
        """Every question the room asked, with its counted votes (the presenter's export)."""
        c = Conn(self.host, self.port)
        status, _, data = await c.request("GET", f"/classroom/{self.room}/export?key={self.key}")
        c.close()
        if status != 200:
            raise RuntimeError(f"export HTTP {status}")
        return json.loads(data)["questions"]

    async def stream_once(self) -> float:
        """One streaming request: its tokens/s between the first and the last token."""
        c = Conn(self.host, self.port)
        await c.send("POST", "/v1/chat/completions", self.body(True))
        status, headers = await c.head()
        if status != 200:
            raise RuntimeError(f"stream: HTTP {status}")
        times, buf = [], b""
        async for piece in c.chunks(headers):
            buf += piece
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if ev.startswith(b"data: {") and b'"content"' in ev:
                    times.append(time.perf_counter())
        c.close()
        if len(times) < 2:
            raise RuntimeError("stream: fewer than 2 tokens")
        return (len(times) - 1) / (times[-1] - times[0])


async def audience(hall: Hall, seen: dict, shown: dict, joins: list, errors: dict, stop: asyncio.Event,
                   fetches: list, me: int = 0, votes: list | None = None) -> None:
    """One student's page: follow the room's events; fetch each (stage, trace version) once;
    vote once on each question opened (when votes is a list: it collects the sent votes)."""
    cache: set = set()
    voted: set = set()
    lang = hall.langs[me % len(hall.langs)]  # this screen's language (a room builds each once)
    pages = Conn(hall.host, hall.port)
    while not stop.is_set():
        sse = Conn(hall.host, hall.port)
        try:
            t0 = time.perf_counter()
            await sse.send("GET", f"/classroom/{hall.room}/events", headers={"Accept": "text/event-stream"})
            status, headers = await sse.head()
            if status != 200:
                raise RuntimeError(f"events HTTP {status}")
            first, buf = True, b""
            async for piece in sse.chunks(headers):
                buf += piece
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    data = next((ln[6:] for ln in ev.split(b"\n") if ln.startswith(b"data: ")), None)
                    if data is None or b"event: state" not in ev:  # a ping, or the retry line
                        continue
                    t = time.perf_counter()
                    s = json.loads(data)
                    if first:
                        joins.append(t - t0)
                        first = False
                    seen[s["version"]] = (t, s["stage"])
                    key = (s["stage"], s["trace_version"])
                    if key not in cache:
                        st, _, body = await pages.request("GET", f"/classroom/{hall.room}/stage/{s['stage']}"
                                                          f"?v={s['trace_version']}&lang={lang}")
                        fetches.append(1)
                        if st != 200 or b'"html"' not in body:
                            raise RuntimeError(f"stage HTTP {st}")
                        cache.add(key)
                    shown[s["version"]] = (time.perf_counter(), s["stage"])
                    q = s.get("question")
                    if votes is not None and q and not q["revealed"] and q["id"] not in voted:
                        voted.add(q["id"])
                        pick = q["candidates"][me % len(q["candidates"])]["choice"]
                        st, _, body = await pages.request("POST", f"/classroom/{hall.room}/vote", json.dumps(
                            {"choice": pick, "voter": f"hall-load-{me:06d}"}).encode())
                        if st != 200:
                            raise RuntimeError(f"vote HTTP {st}")
                        votes.append(q["id"])
        except asyncio.CancelledError:
            break
        except Exception as e:  # noqa: BLE001 (counted, then reconnect as EventSource would)
            kind = type(e).__name__ + (f": {e}" if isinstance(e, RuntimeError) else "")
            errors[kind] = errors.get(kind, 0) + 1
            pages.close()
            pages = Conn(hall.host, hall.port)
            await asyncio.sleep(1.0)
        finally:
            sse.close()
    pages.close()


async def presenter(hall: Hall, seconds: float, every: float, moves: list, errors: dict,
                    ask: bool = False) -> None:
    """Moves every `every` seconds; with ask, opens the question at the sampling stage and
    reveals (then closes) it just before moving on."""
    c = Conn(hall.host, hall.port)
    stage, end, asking = 0, time.perf_counter() + seconds, False

    async def question(action: str) -> None:
        st, _, _ = await c.request("POST", f"/classroom/{hall.room}/question",
                                   json.dumps({"key": hall.key, "action": action}).encode())
        if st != 200:
            raise RuntimeError(f"question {action} HTTP {st}")
    while time.perf_counter() < end:
        stage = (stage + 1) % hall.count
        t0 = time.perf_counter()
        try:
            if asking:
                await question("reveal")
                await question("close")
                asking = False
                t0 = time.perf_counter()
            st, _, data = await c.request("POST", f"/classroom/{hall.room}/goto",
                                          json.dumps({"key": hall.key, "stage": stage}).encode())
            if st != 200:
                raise RuntimeError(f"goto HTTP {st}")
            moves.append((json.loads(data)["version"], stage, t0))
            if ask and stage == hall.sample_stage:
                await question("open")
                asking = True
        except Exception as e:  # noqa: BLE001
            errors[f"presenter {type(e).__name__}"] = errors.get(f"presenter {type(e).__name__}", 0) + 1
            c.close()
            c = Conn(hall.host, hall.port)
        await asyncio.sleep(max(0.0, t0 + every - time.perf_counter()))
    c.close()


async def streamer(hall: Hall, stop: asyncio.Event, rates: list, errors: dict) -> None:
    while not stop.is_set():
        try:
            rates.append(await hall.stream_once())
        except Exception as e:  # noqa: BLE001
            errors[f"stream {type(e).__name__}"] = errors.get(f"stream {type(e).__name__}", 0) + 1
            await asyncio.sleep(0.5)


async def trial(hall: Hall, clients: int, seconds: float, every: float = 1.5, solo: float | None = None,
                ramp_s: float = 3.0, grace_s: float = 2.0, votes: bool = False) -> Trial:
    clients, seconds = min(clients, MAX_CLIENTS), min(seconds, MAX_SECONDS)
    out = Trial(clients, seconds, loadavg=[os.getloadavg()[0]])
    solo_before = solo if solo is not None else max([await hall.stream_once() for _ in range(3)])
    seen = [dict() for _ in range(clients)]
    shown = [dict() for _ in range(clients)]
    joins: list[float] = []
    errors: dict = {}
    fetches: list = []
    sent: list = []
    asked_before = len(await hall.questions()) if votes else 0
    stop = asyncio.Event()
    tasks = []
    for i in range(clients):  # a hall fills over a few seconds, not in one instant
        tasks.append(asyncio.create_task(audience(hall, seen[i], shown[i], joins, errors, stop, fetches, i,
                                                  sent if votes else None)))
        await asyncio.sleep(ramp_s / clients)
    end = time.perf_counter() + 10 + ramp_s
    while len(joins) < clients and time.perf_counter() < end:
        await asyncio.sleep(0.05)
    rates: list[float] = []
    moves: list = []
    stream = asyncio.create_task(streamer(hall, stop, rates, errors))
    await presenter(hall, seconds, every, moves, errors, ask=votes)
    await asyncio.sleep(grace_s)  # the last move's stragglers
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.wait_for(stream, 120)  # the stream running finishes its request
    # the stream alone before and after (best of 3 each): the machine is shared and its load drifts
    solo_after = solo if solo is not None else max([await hall.stream_once() for _ in range(3)])
    solo = out.stream_tps_solo = (solo_before + solo_after) / 2
    out.stream_tps_solo_range = [solo_before, solo_after]
    lat, lags, missed, missed_views = [], [], 0, 0
    for k, (version, stage, t0) in enumerate(moves):
        # a client that got a later state of the same move (the question opened, a vote count) saw it too
        until = moves[k + 1][0] if k + 1 < len(moves) else float("inf")
        worst, miss = 0.0, 0
        for i in range(clients):
            got = [t for v, (t, st) in seen[i].items() if version <= v < until and st == stage]
            if got:
                lat.append(min(got) - t0)
            had = [t for v, (t, st) in shown[i].items() if version <= v < until and st == stage]
            if had:
                worst = max(worst, min(had) - t0)
            else:
                miss += 1
        missed += miss > 0
        missed_views += miss
        lags.append(worst if not miss else float("inf"))
    out.moves, out.missed, out.missed_views = len(moves), missed, missed_views
    out.errors, out.error_kinds = sum(errors.values()) + clients - len(joins), errors
    if len(joins) < clients:
        out.error_kinds["never joined"] = clients - len(joins)
    out.state_p50_ms, out.state_p99_ms = pct(lat, 0.5) * 1000, pct(lat, 0.99) * 1000
    out.join_p99_ms = pct(joins, 0.99) * 1000
    finite = [x for x in lags if x != float("inf")]
    out.worst_lag_s = max(lags) if lags else 0.0
    out.lag_p50_s = pct(finite, 0.5)
    out.stage_fetches = len(fetches)
    if votes:  # every vote sent is counted once, as the server's export says
        asked = (await hall.questions())[asked_before:]
        out.questions, out.votes_sent = len(asked), len(sent)
        out.votes_counted = sum(q["votes"] for q in asked)
        if out.votes_counted != out.votes_sent:
            out.errors += 1
            out.error_kinds["votes counted != sent"] = out.votes_counted - out.votes_sent
    out.stream_tps_loaded = statistics.median(rates) if rates else 0.0
    out.stream_ratio = out.stream_tps_loaded / solo if solo else 0.0
    out.loadavg.append(os.getloadavg()[0])
    return out


async def find_max(hall: Hall, start: int, seconds: float, max_clients: int, max_trials: int,
                   report=print, votes: bool = False) -> tuple[int, list[Trial]]:
    """The largest audience meeting BAR: double from start until a trial fails, then bisect."""
    trials: list[Trial] = []
    good, bad, n = 0, None, start
    while len(trials) < max_trials:
        t = await trial(hall, n, seconds, votes=votes)  # the solo speed again each time: the load drifts
        trials.append(t)
        report(t.line())
        if not t.meets() and len(trials) < max_trials:  # on a shared machine one bad run is not the answer
            await asyncio.sleep(2.0)
            t = await trial(hall, n, seconds, votes=votes)
            trials.append(t)
            report(t.line() + "  (again)")
        if t.meets():
            good = max(good, n)
        else:
            bad = n if bad is None else min(bad, n)
        if bad is None:
            if n >= max_clients:
                break
            n = min(max_clients, n * 2)
        else:
            if bad - good <= max(10, good // 10):
                break
            n = (good + bad) // 2
        await asyncio.sleep(2.0)  # let the last trial's sockets close
    return good, trials


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hall_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=100, help=f"audience clients (at most {MAX_CLIENTS})")
    p.add_argument("--seconds", type=float, default=20.0, help=f"how long the presenter moves (at most {MAX_SECONDS})")
    p.add_argument("--move-every", type=float, default=1.5)
    p.add_argument("--votes", action="store_true",
                   help="the presenter asks 'predict the next token' at the sampling stage; every client votes")
    p.add_argument("--find-max", action="store_true", help="the largest audience meeting the hall's bar")
    p.add_argument("--max-clients", type=int, default=1200)
    p.add_argument("--max-trials", type=int, default=8)
    p.add_argument("--url", help="a running server on loopback (default: start `python -m app`)")
    p.add_argument("--max-tokens", type=int, default=32, help="the streaming request's length")
    p.add_argument("--langs", default="en", help="the followers' languages in turn, e.g. en,zh-CN")
    p.add_argument("--json", help="write the trials here")
    p.add_argument("server_args", nargs="*", help="after --: options for `python -m app` (e.g. -- --model smollm2)")
    a = p.parse_args(argv)
    proc = None
    url = a.url
    if url is None:
        proc, url = start_server(a.server_args)
    try:
        hall = Hall(url, max_tokens=a.max_tokens, langs=tuple(a.langs.split(",")))

        async def go():
            await hall.make_room()
            if a.find_max:
                best, trials = await find_max(hall, a.clients, a.seconds, min(a.max_clients, MAX_CLIENTS),
                                              a.max_trials, votes=a.votes)
                print(f"largest audience meeting the bar: {best} clients")
                return trials
            t = await trial(hall, a.clients, a.seconds, a.move_every, votes=a.votes)
            print(t.line())
            if t.error_kinds:
                print("errors:", t.error_kinds)
            return [t]
        trials = asyncio.run(go())
        if a.json:
            with open(a.json, "w") as f:
                json.dump([asdict(t) for t in trials], f, indent=1)
        return 0 if trials and (a.find_max or trials[-1].meets()) else 1
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
