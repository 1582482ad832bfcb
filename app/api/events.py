"""The live event stream (GET /ws, a WebSocket) and recorded traces (GET /v1/traces/{id}, and
its timeline for Perfetto: GET /v1/traces/{id}/perfetto).

/ws sends every request's trace events as JSON text frames; /ws?request_id=ID only that
request's. Each socket reads a bounded queue: when it falls behind, what it missed is
counted and reported in a {"type": "dropped", "count": N} marker instead of slowing the
engine down.

A client may also send a chat body (the JSON of POST /v1/chat/completions) as a text
frame: it is checked like the HTTP one, answered with {"type": "request.submitted",
"request_id"} or {"type": "error", "error": {...}}, and its "output" items (the text) come
with its events. The socket owns that request: closing it aborts the request.
"""
from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections import OrderedDict

from fastapi import FastAPI, Response, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from app.serving.limits import RequestRefused, client_of
from app.api.openai_routes import error, prepare, read_json, refusal
from app.api.library_routes import not_found, stored_trace
from app.serving.recording import record_request
from app.serving.served_models import ServedModels
from engine import LLMEngine
from engine.trace import SCHEMA_VERSION
from visualizers.perfetto import perfetto_trace

WS_QUEUE = 2000  # events a socket may fall behind before it starts losing them
FILE_CACHE_BYTES = 64 * 2**20  # finished traces' files kept as text for repeated GETs


class FileCache:
    """Finished traces' files, as served: a replay viewer or a poller asking again for a long
    answer's trace would otherwise cost a second of CPU (decode, re-encode) every time."""

    def __init__(self, max_bytes: int = FILE_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._files: OrderedDict[str, tuple[tuple, str]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, request_id: str, version: tuple) -> str | None:
        with self._lock:
            hit = self._files.get(request_id)
            if hit is None or hit[0] != version:
                return None
            self._files.move_to_end(request_id)
            return hit[1]

    def put(self, request_id: str, version: tuple, text: str) -> None:
        if len(text) > self.max_bytes:
            return
        with self._lock:
            self._files[request_id] = (version, text)
            while sum(len(t) for _, t in self._files.values()) > self.max_bytes:
                self._files.popitem(last=False)


def add_event_routes(api: FastAPI, served, library=None) -> None:
    """library (app/store/library.py): where a trace memory no longer holds is looked for."""
    models = ServedModels.of(served)
    files = FileCache()

    @api.get("/v1/traces/{request_id}")
    def trace(request_id: str):
        service = models.owner(request_id)  # ids are unique across engines
        if service is None:  # not in memory: the database's copy (an earlier run's, another server's)
            return stored_trace(library, request_id) if library is not None else not_found(request_id)
        version = service.store.version(request_id)
        text = files.get(request_id, version) if version is not None else None
        if text is None:
            rec = record_request(service.store, request_id, service.model_info(), service.piece,
                                 service.is_special)
            if rec is None:
                return error(404, f"{request_id!r} was not traced (trace_level off)", param="request_id",
                             code="trace_not_found")
            # the same file the page exports and `python -m app --replay` serves (dumps() encodes it item
            # by item, so a poller of a long request's trace does not hold the GIL for a second at a time)
            text = rec.dumps()
            if version is not None and version[0]:  # finished: the same file until something is added
                files.put(request_id, version, text)
        return Response(text, media_type="application/json")

    @api.get("/v1/traces/{request_id}/perfetto")
    def perfetto(request_id: str):
        """The request's timeline as Chrome trace-event JSON: open it in ui.perfetto.dev."""
        service = models.owner(request_id)
        rec = None if service is None else record_request(service.store, request_id, service.model_info(),
                                                          service.piece, service.is_special)
        if rec is None and library is not None and service is None:
            rec = library.recording(request_id)
        if rec is None:
            return error(404, f"no trace is kept for {request_id!r} (unknown, dropped as one of the oldest, or "
                              "not traced)", param="request_id", code="trace_not_found")
        return JSONResponse(perfetto_trace(rec.events, request_id, rec.model.get("name")))

    @api.websocket("/ws")
    async def events(websocket: WebSocket, request_id: str | None = None) -> None:
        await _serve_socket(websocket, models, request_id)


async def _serve_socket(websocket: WebSocket, models: ServedModels, request_id: str | None) -> None:
    """/ws: every request's events (or one request's, its stored backlog first), and requests sent as frames."""
    await websocket.accept()
    watch = models.subscribe(request_id, WS_QUEUE) if request_id else models.subscribe_all(WS_QUEUE)
    # one request's socket opened after it began (or ended): what the store holds of it first, then the
    # rest as it comes, each once (a running request's stored items are the ones its watchers get)
    backlog = await run_in_threadpool(_backlog, models, request_id) if request_id else []
    seen = {id(e) for e in backlog}
    closed = asyncio.Event()
    owned: set[str] = set()  # requests this socket sent and that have not finished

    async def submit(text: str) -> None:
        nonlocal watch
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        endpoint = "chat"  # (a completion body's refusals by the engine name its prompt)
        try:
            if len(text) > models.limits.max_body_bytes:
                raise RequestRefused(f"the body is larger than this server's limit of "
                                     f"{models.limits.max_body_bytes:,} bytes", status=413)
            service, sub = prepare(models, read_json(text))
            endpoint = "chat" if sub.prompt is None else "completion"
            own = await run_in_threadpool(service.submit, sub, rid, client_of(websocket))
        except ValueError as e:
            await websocket.send_json({"schema": SCHEMA_VERSION, "type": "error", "request_id": None,
                                       **json.loads(refusal(e, models, endpoint).body)})
            return
        owned.update(LLMEngine.choice_ids(rid, sub.params.n))  # n > 1: every choice's outputs are its own
        if request_id:  # a socket that watches one request follows the one it sent
            own.max_items = WS_QUEUE
            models.unsubscribe(watch)
            watch = own
        else:  # the firehose carries it already
            service.unsubscribe(own)
        await websocket.send_json({"schema": SCHEMA_VERSION, "type": "request.submitted", "request_id": rid})

    async def watch_close() -> None:  # the client may close (or send a request) at any time
        try:
            while True:
                await submit(await websocket.receive_text())
        except (WebSocketDisconnect, RuntimeError, KeyError):  # closed, or a binary frame
            closed.set()
            for rid in list(owned):  # free its KV blocks now, not after the next drain
                await run_in_threadpool(models.abort, rid)

    reader = asyncio.create_task(watch_close())
    reported = 0
    try:
        for item in backlog:
            await websocket.send_json(item)
        while not closed.is_set():
            items = await run_in_threadpool(watch.drain, 0.25)
            if watch.dropped > reported:
                await websocket.send_json({"schema": SCHEMA_VERSION, "type": "dropped", "request_id": request_id,
                                           "count": watch.dropped - reported})
                reported = watch.dropped
            for item in items:
                if seen and id(item) in seen:  # sent with the backlog
                    continue
                if item.get("type") != "output":  # trace events; text only for its own requests
                    await websocket.send_json(item)
                elif item["request_id"] in owned:
                    await websocket.send_json(item)
                    if item["finished"]:
                        owned.discard(item["request_id"])
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        reader.cancel()
        models.unsubscribe(watch)
        for rid in list(owned):  # the server closed the socket first
            await run_in_threadpool(models.abort, rid)


def _backlog(models: ServedModels, request_id: str) -> list[dict]:
    """The trace events the store holds of a request (none: unknown, untraced, not begun)."""
    service = models.owner(request_id)
    tr = service.store.trace(request_id) if service is not None else None
    return list(tr.events) if tr is not None else []
