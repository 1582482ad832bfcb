"""The library of recorded traces over HTTP, OpenAI's list shape:

    GET    /v1/traces?limit=20&after=ID&q=WORDS   {"object": "list", "data": [...], "first_id", "last_id", "has_more"}
    POST   /v1/traces                             a trace file (the page's export) into the library: 201
    DELETE /v1/traces/{id}                        {"id", "object": "trace", "deleted": true}
    PATCH  /v1/traces/{id}  {"pinned": true}      {"id", "object": "trace", "pinned": true}

Newest first; `after` is the last id of the page before (a page past the end is an empty list,
has_more false; an `after` that names no trace is a 404). GET /v1/traces/{id} (app/api/events.py)
reads the database for a trace memory no longer holds; a replay server (no model) answers it
here. In public mode the list, the import, delete and pin need --api-key: a visitor opens
only traces whose (unguessable) id they hold."""
from __future__ import annotations

from fastapi import FastAPI, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool
from starlette.concurrency import run_in_threadpool

from app.api.openai_routes import error, read_json
from app.api.schemas import add_body_schemas, request_body
from app.serving.limits import RequestRefused
from app.serving.recording import MAX_FILE_BYTES, Recording, TraceFileError
from app.store.library import MAX_LIST, Library


class TraceFile(BaseModel):
    """A trace file as the page exports it (docs: Trace format); checked by Recording.from_json."""
    model_config = ConfigDict(extra="allow")
    schema_: int = Field(alias="schema")
    id: str
    model: dict
    events: list[dict]
    outputs: list[dict]


class TraceChange(BaseModel):
    """PATCH /v1/traces/{id}: pin (true) or unpin (false) a trace."""
    model_config = ConfigDict(extra="forbid")
    pinned: StrictBool


def not_found(request_id: str) -> Response:
    return error(404, f"no trace is kept for {request_id[:200]!r} (unknown, deleted, or dropped as one of the "
                      "oldest)", param="request_id", code="trace_not_found")


def stored_trace(library: Library, request_id: str) -> Response:
    """A trace file from the database (a 404 in OpenAI's shape when it has none)."""
    text = library.stored_text(request_id)
    return not_found(request_id) if text is None else Response(text, media_type="application/json")


def add_library_routes(api: FastAPI, library: Library, replay: bool = False) -> None:
    def closed() -> Response | None:
        return error(403, "this public server keeps its library private: start it with --api-key to list, "
                          "import, delete or pin traces", code="library_private") if library.private else None

    @api.get("/v1/traces")
    def listed(limit: int = Query(20, ge=1, le=MAX_LIST), after: str | None = None, q: str = ""):
        if (refused := closed()) is not None:
            return refused
        try:
            items, more = library.listed(limit, after, q[:200])
        except KeyError:
            return error(404, f"after={after[:200]!r} names no trace in the library", param="after",
                         code="trace_not_found")
        return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
                "last_id": items[-1]["id"] if items else None, "has_more": more,
                "database": library.health()}

    add_body_schemas(api, TraceFile, TraceChange)

    @api.post("/v1/traces", status_code=201, openapi_extra=request_body(TraceFile, "a trace file"))
    async def imported(request: Request):
        if (refused := closed()) is not None:
            return refused
        raw = await request.body()
        if len(raw) > MAX_FILE_BYTES:
            return error(413, f"a trace file is at most {MAX_FILE_BYTES // 2**20} MiB")
        try:
            rec = await run_in_threadpool(Recording.loads, raw)
        except TraceFileError as e:
            return error(400, str(e)[:300], code="invalid_trace")
        if await run_in_threadpool(library.exists, rec.request_id):
            return error(409, f"the library already holds {rec.request_id[:200]!r}", param="id",
                         code="trace_exists")
        if not await run_in_threadpool(library.add_file, rec):
            return error(503, "the database is not reachable (or is off: --db none): nothing was stored",
                         code="database_unavailable")
        return {"id": rec.request_id, "object": "trace", "stored": True}

    @api.delete("/v1/traces/{request_id}")
    def deleted(request_id: str):
        if (refused := closed()) is not None:
            return refused
        if not library.delete(request_id):
            return not_found(request_id)
        return {"id": request_id, "object": "trace", "deleted": True}

    @api.patch("/v1/traces/{request_id}", openapi_extra=request_body(TraceChange))
    async def changed(request_id: str, request: Request):
        if (refused := closed()) is not None:
            return refused
        try:
            change = TraceChange.model_validate(read_json(await request.body()))
        except (RequestRefused, ValueError) as e:
            return error(400, f"the body must be {{\"pinned\": true}} or {{\"pinned\": false}} ({str(e)[:150]})",
                         param="pinned")
        if not await run_in_threadpool(library.pin, request_id, change.pinned):
            return not_found(request_id)
        return {"id": request_id, "object": "trace", "pinned": change.pinned}

    if replay:  # no engine: no event routes; the library's traces still open by id
        @api.get("/v1/traces/{request_id}")
        def trace(request_id: str):
            return stored_trace(library, request_id)
