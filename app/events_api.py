"""The live event stream (GET /ws, a WebSocket) and recorded traces (GET /v1/traces/{id}).

/ws sends every request's trace events as JSON text frames; /ws?request_id=ID only that
request's. Each socket reads a bounded queue: when it falls behind, what it missed is
counted and reported in a {"type": "dropped", "count": N} marker instead of slowing the
engine down.
"""
from __future__ import annotations

import asyncio

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from starlette.concurrency import run_in_threadpool

from app.engine_service import EngineService
from app.openai_api import error
from app.recording import record_request

WS_QUEUE = 2000  # events a socket may fall behind before it starts losing them


def add_event_routes(api: FastAPI, service: EngineService) -> None:
    @api.get("/v1/traces/{request_id}")
    def trace(request_id: str):
        if request_id not in service.store:
            return error(404, f"no trace is kept for {request_id!r} (unknown, or dropped as one of the oldest)",
                         param="request_id", code="trace_not_found")
        rec = record_request(service.store, request_id, service.model_info(), service.piece, service.is_special)
        if rec is None:
            return error(404, f"{request_id!r} was not traced (trace_level off)", param="request_id",
                         code="trace_not_found")
        return rec.to_json()  # the same file the page exports and `python -m app --replay` serves

    @api.websocket("/ws")
    async def events(websocket: WebSocket, request_id: str | None = None) -> None:
        await websocket.accept()
        watch = service.subscribe(request_id, WS_QUEUE) if request_id else service.subscribe_all(WS_QUEUE)
        closed = asyncio.Event()

        async def watch_close() -> None:  # the client may close at any time
            try:
                while True:
                    await websocket.receive_text()
            except WebSocketDisconnect:
                closed.set()

        reader = asyncio.create_task(watch_close())
        reported = 0
        try:
            while not closed.is_set():
                items = await run_in_threadpool(watch.drain, 0.25)
                if watch.dropped > reported:
                    await websocket.send_json({"schema": 1, "type": "dropped", "request_id": request_id,
                                               "count": watch.dropped - reported})
                    reported = watch.dropped
                for item in items:
                    if item.get("type") != "output":  # the socket carries trace events only
                        await websocket.send_json(item)
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            reader.cancel()
            service.unsubscribe(watch)
