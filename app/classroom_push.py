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
