"""Push for a classroom: the room's state goes to every follower as a server-sent event.

One JSON message per room version, encoded once and written to every open stream; a
follower that falls behind gets the newest state only (states replace each other, so
nothing is queued per client). Everything here runs on the server's event loop, never on
the engine's thread, and touches no engine: a hall of students costs the engine nothing
but the loop's share of the CPU.
"""
from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator
from urllib.parse import unquote

from visualizers import i18n

KEEPALIVE = 15.0  # seconds between pings on a quiet stream (proxies close idle ones; pages notice dead ones)
RETRY_MS = 1000  # how soon EventSource reconnects after a lost connection


class Feed:
    """The newest state of one room and a wake-up for everyone waiting on it."""

    def __init__(self) -> None:
        self.data = b"{}"  # the state's JSON (GET /state serves these bytes too)
        self.event = b""  # the same as one SSE message
        self.followers = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None

    def bind(self) -> None:
        """Called from the server's loop (the first stream or request) before waiting."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._changed = asyncio.Event()

    def publish(self, state: dict) -> None:
        """Set the newest state (from any thread) and wake every follower."""
        data = json.dumps(state, separators=(",", ":"))
        self.data = data.encode()
        self.event = f"id: {state.get('version', 0)}\nevent: state\ndata: {data}\n\n".encode()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                if asyncio.get_running_loop() is loop:
                    self._wake()
                    return
            except RuntimeError:  # another thread
                pass
            loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        old, self._changed = self._changed, asyncio.Event()
        if old is not None:
            old.set()

    async def follow(self) -> AsyncIterator[bytes]:
        """The stream of one follower: the current state at once (a late joiner, a reload or a
        reconnect resumes where the room is), then each newer one."""
        self.bind()
        self.followers += 1
        try:
            yield f"retry: {RETRY_MS}\n\n".encode()
            sent = None
            while True:
                if self.event is not sent:
                    sent = self.event
                    yield sent
                changed = self._changed
                try:
                    await asyncio.wait_for(changed.wait(), KEEPALIVE)
                except asyncio.TimeoutError:
                    yield b"event: ping\ndata: {}\n\n"  # the page sees it: a silent stream is a dead one
        finally:
            self.followers -= 1


def stage_lang(query: list[str]) -> str:
    """The language a stage is asked in: its ?lang= (the screen's), else English."""
    tag = next((q[5:] for q in query if q.startswith("lang=")), None)
    return i18n.normalize(unquote(tag or "")) or i18n.DEFAULT


class CachedStages:
    """ASGI middleware: GET /classroom/{room}/stage/{i} answered from the room's cache without
    routing, validation or a thread: a hall fetches each stage at once after every move, and
    what the server's loop spends there it takes from the engine's share of the CPU (and GIL).
    Anything not already rendered goes on to the route."""

    def __init__(self, app, classrooms) -> None:
        self.app, self.classrooms = app, classrooms

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"].startswith("/classroom/"):
            parts = scope["path"].split("/")  # "", "classroom", room, "stage", i
            if len(parts) == 5 and parts[3] == "stage" and parts[4].isdigit():
                room = self.classrooms.get(parts[2])
                query = scope.get("query_string", b"").decode("latin-1").split("&")
                lang = stage_lang(query)
                body = room.cached_stage(int(parts[4]), lang) if room is not None else None
                if body is not None:
                    await self._send(room, int(parts[4]), lang, body, query, scope, send)
                    return
        await self.app(scope, receive, send)

    @staticmethod
    async def _send(room, i: int, lang: str, body: bytes, query: list[str], scope, send) -> None:
        etag = room.etag(i, lang).encode()
        pinned = f"v={room.trace_version}" in query
        cache = b"public, max-age=86400, immutable" if pinned else b"no-cache"
        match = any(k == b"if-none-match" and v == etag for k, v in scope["headers"])
        headers = [(b"etag", etag), (b"cache-control", cache)]
        if match:
            await send({"type": "http.response.start", "status": 304, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
