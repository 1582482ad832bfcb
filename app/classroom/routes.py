"""The classroom's HTTP routes, on one APIRouter: make a room; its page, state (stream and
poll) and stages for everyone; what only the presenter may do; a student's vote; the
presenter's take-aways. One dependency finds the room (a 404 in OpenAI's error shape when
it is gone); bodies are the models of app.classroom.bodies; every refusal is in OpenAI's
error shape."""
from __future__ import annotations

import asyncio
import hmac
import json
import secrets
from typing import Annotated, Awaitable, Callable

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from app.api.openai_routes import read_body, read_json
from app.api.schemas import add_body_schemas, request_body
from app.classroom.bodies import (MAX_UPLOAD, NO_VOTER, ROOM_SHAPE, Ask, CodeView, Goto, NewRoom, Pick, Vote,
                                  read_model)
from app.classroom.bundle import bundle_zip
from app.classroom.page import page_html
from app.classroom.push import CachedStages
from app.classroom.question import VoteRefused
from app.classroom.rooms import Classrooms, Room
from app.serving.limits import RequestRefused
from app.serving.recording import Recording, TraceFileError
from visualizers import i18n
from visualizers._html import esc

VOTER_COOKIE = "tt_voter"
OPEN = {"Access-Control-Allow-Origin": "*"}  # a static bundle on another origin follows and votes


class RoomMissing(LookupError):
    """No room by that id (closed, or the server restarted)."""

    def __init__(self, room_id: str, page: bool = False) -> None:
        super().__init__(room_id)
        self.room_id, self.page = room_id, page


def _error(status: int, message: str, param: str | None, code: str | None = None,
           type_: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}}, status)


def _missing(request: Request, e: RoomMissing) -> Response:
    if e.page:  # a person's browser: a sentence, not JSON
        return HTMLResponse(f"<p>No classroom {esc(e.room_id)}: it was closed or the server restarted.</p>", 404)
    return _error(404, f"no classroom {e.room_id!r} (closed, or the server restarted)", "room_id", "room_not_found")


def _refused(e: VoteRefused) -> JSONResponse:
    return _error(e.status, str(e), e.param)


def _forbidden(message: str = "only the presenter can do this") -> JSONResponse:
    return _error(403, message, "key", type_="permission_error")


def _is_presenter(room: Room, key: object) -> bool:
    return isinstance(key, str) and bool(key) and hmac.compare_digest(key, room.key)


async def _ready(room: Room, lang: str = i18n.DEFAULT) -> None:
    """Stages built (off the loop) in `lang` too, the feed bound to this loop and holding the state."""
    if not room._stages:
        await run_in_threadpool(room.stage_list)
    if lang not in room.langs:  # the room's first screen in this language: every stage in it, once
        await run_in_threadpool(room.prerender, lang)
    room.start()


def screen_lang(request: Request) -> str:
    """A screen's own language: ?lang=, its switch's cookie, its browser's Accept-Language."""
    return i18n.choose(request.query_params.get("lang"), request.cookies.get(i18n.COOKIE),
                       request.headers.get("accept-language"))


def add_classroom_routes(api: FastAPI, classrooms: Classrooms, css: str,
                         recorder: Callable[[str], Recording | None]) -> None:
    """recorder(request_id): the kept trace of a request (None when there is none)."""
    api.add_middleware(CachedStages, classrooms=classrooms)
    api.state.classrooms = classrooms  # what find_room reads
    api.add_exception_handler(RoomMissing, _missing)
    api.include_router(classroom_router(classrooms, css, recorder))
    add_body_schemas(api, NewRoom, Goto, Ask, Pick, CodeView, Vote)


def find_room(room_id: str, request: Request) -> Room:
    """The dependency of every room's route: its room, or a 404 (RoomMissing's handler)."""
    room = request.app.state.classrooms.get(room_id)
    if room is None:
        raise RoomMissing(room_id)
    return room


def find_page(room_id: str, request: Request) -> Room:
    """find_room for the room's page, whose 404 is a sentence for a person."""
    try:
        return find_room(room_id, request)
    except RoomMissing:
        raise RoomMissing(room_id, page=True) from None


FoundRoom = Annotated[Room, Depends(find_room)]
PageRoom = Annotated[Room, Depends(find_page)]


def classroom_router(classrooms: Classrooms, css: str, recorder: Callable[[str], Recording | None]) -> APIRouter:
    router = APIRouter(prefix="/classroom", tags=["classroom"])
    _make_route(router, classrooms, recorder)
    _follow_routes(router, css)
    _presenter_routes(router)
    _vote_route(router)
    _file_routes(router, css)
    return router


def _make_route(router: APIRouter, classrooms: Classrooms, recorder: Callable[[str], Recording | None]) -> None:
    @router.post("", openapi_extra=request_body(NewRoom))
    async def create(request: Request):
        """{"request_id": ID} (a request this server kept) or {"trace": <trace file>} -> the room's links."""
        try:
            raw = read_json(await read_body(request, MAX_UPLOAD))
            body = NewRoom.model_validate(raw)
        except RequestRefused as e:
            return _error(e.status, str(e), e.param, e.code, e.type)
        except ValidationError as e:
            name = str(e.errors()[0]["loc"][0])
            return _error(400, ROOM_SHAPE if name == "trace" else f"{name} must be a string: a request this "
                          "server kept", None if name == "trace" else name)
        if ("request_id" in body.model_fields_set) == ("trace" in body.model_fields_set):
            return _error(400, ROOM_SHAPE, None)
        if "trace" in body.model_fields_set:
            try:
                rec, refresh = Recording.from_json(raw["trace"]), None
            except TraceFileError as e:
                return _error(400, str(e), "trace")
        else:
            rid = body.request_id
            rec = await run_in_threadpool(recorder, rid) if rid is not None else None
            if rec is None:
                return _error(404, f"no trace is kept for {rid!r}", "request_id", "trace_not_found")
            refresh = (lambda: recorder(rid)) if not any(e["type"] == "finish" for e in rec.events) else None
        room = await run_in_threadpool(classrooms.create, rec, refresh)
        await _ready(room)
        return {"id": room.room_id, "request_id": rec.request_id, "presenter_url": f"/classroom/{room.room_id}?key="
                f"{room.key}", "audience_url": f"/classroom/{room.room_id}", "stages": len(room._stages)}


def _follow_routes(router: APIRouter, css: str) -> None:
    """A room's page, its state (stream and poll) and its stages, for everyone."""
    @router.get("/{room_id}", response_class=HTMLResponse)
    async def classroom_page(room: PageRoom, request: Request, key: str = ""):
        lang = screen_lang(request)
        await _ready(room, lang)
        answer = HTMLResponse(page_html(room, _is_presenter(room, key), css, lang=lang))
        if VOTER_COOKIE not in request.cookies:  # one id per browser: its vote counts once
            answer.set_cookie(VOTER_COOKIE, secrets.token_urlsafe(12), max_age=30 * 86400, httponly=True,
                              samesite="lax")
        return answer

    @router.get("/{room_id}/events")
    async def events(room: FoundRoom):
        """Server-sent events: the room's state now, then each change (stage, trace, question)."""
        await _ready(room)
        return StreamingResponse(room.feed.follow(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **OPEN})

    @router.get("/{room_id}/state")
    async def state(room: FoundRoom):
        """The same state as the stream's last event (for a client without EventSource)."""
        await _ready(room)
        return Response(room.feed.data, media_type="application/json", headers={"Cache-Control": "no-cache", **OPEN})

    @router.get("/{room_id}/stage/{index}")
    async def stage(room: FoundRoom, index: int, request: Request, v: int | None = None, lang: str = ""):
        """A stage's HTML (in JSON) in ?lang= (English without), rendered once per trace version and
        language. ?v=<trace_version> makes the URL immutable (cached for a day); either way an
        If-None-Match of its ETag gets a 304."""
        n = len(room._stages) or len(await run_in_threadpool(room.stage_list))
        if not 0 <= index < n:
            return _error(404, f"stage must be in [0, {n - 1}]", "index")
        lang = i18n.normalize(lang) or i18n.DEFAULT
        etag = room.etag(index, lang)
        cache = ("public, max-age=86400, immutable" if v == room.trace_version else "no-cache")
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"ETag": etag, "Cache-Control": cache})
        body = room.cached_stage(index, lang) or await run_in_threadpool(room.stage_body, index, lang)
        return Response(body, media_type="application/json", headers={"ETag": etag, "Cache-Control": cache})


async def _as_presenter(room: Room, request: Request, model: type, act: Callable[[Room, object], Awaitable[dict]],
                        refused: str = "only the presenter can do this") -> dict | JSONResponse:
    """A presenter's POST: the body as `model`, with the presenter's key, the stages ready;
    then act(room, body). Each refusal in OpenAI's error shape."""
    try:
        body = await read_model(request, model)
        if not _is_presenter(room, body.key):
            return _forbidden(refused)
        await _ready(room)
        return await act(room, body)
    except VoteRefused as e:
        return _refused(e)


def _presenter_routes(router: APIRouter) -> None:
    """What only the presenter may do: move the class, ask and reveal, pick what every screen shows."""
    @router.post("/{room_id}/goto", openapi_extra=request_body(Goto))
    async def goto(room: FoundRoom, request: Request):
        async def move(room: Room, body: Goto) -> dict:
            n = len(room._stages) or len(await run_in_threadpool(room.stage_list))
            target = max(0, min(body.stage, n - 1))
            for lang in sorted(room.langs):  # rendered in each screen's language before the class is told
                if room.cached_stage(target, lang) is None:
                    await run_in_threadpool(room.stage_body, target, lang)
            room.goto(target)
            return {"stage": room.stage, "version": room.version}
        return await _as_presenter(room, request, Goto, move, "only the presenter can move the class")

    @router.post("/{room_id}/question", openapi_extra=request_body(Ask))
    async def question(room: FoundRoom, request: Request):
        """The presenter: {"key", "action": "open" | "reveal" | "close" | "show"[, "position": int]}
        "predict the next token" (open: at that answer position; default the first answer token;
        show: no question, every stage shows the whole answer)."""
        async def ask(room: Room, body: Ask) -> dict:
            # a moved mask renders the stages again: off the loop
            await run_in_threadpool(room.ask, body.action, body.position)
            return room.state()["question"] or {"id": None}
        return await _as_presenter(room, request, Ask, ask)

    @router.post("/{room_id}/select", openapi_extra=request_body(Pick))
    async def select(room: FoundRoom, request: Request):
        """The presenter: {"key", "position": int | null, "layer": int, "head": int}: what every
        screen's panels show (the pass that read that token; that layer's and head's attention)."""
        async def pick(room: Room, body: Pick) -> dict:
            await run_in_threadpool(room.select, body.position, body.layer, body.head)
            await run_in_threadpool(room.prerender)
            return room.state()
        return await _as_presenter(room, request, Pick, pick)

    @router.post("/{room_id}/code", openapi_extra=request_body(CodeView))
    async def code(room: FoundRoom, request: Request):
        """The presenter: {"key", "open": bool}: every screen opens (or closes) the stage's code."""
        async def show(room: Room, body: CodeView) -> dict:
            room.show_code(body.open)
            return room.state()
        return await _as_presenter(room, request, CodeView, show)


def _vote_route(router: APIRouter) -> None:
    """A student's vote, flushed to every screen in one push."""
    @router.post("/{room_id}/vote", openapi_extra=request_body(Vote))
    async def vote(room: FoundRoom, request: Request):
        """A student: {"choice": <a candidate's place in the order shown>} or {"guess": <text>}; one vote per browser
        (its cookie; a client without cookies sends {"voter": <its own id>})."""
        try:
            body = await read_model(request, Vote)
            voter = request.cookies.get(VOTER_COOKIE) or body.voter
            if not isinstance(voter, str) or not 8 <= len(voter) <= 64:
                raise VoteRefused(NO_VOTER, param="voter")
            room.vote(voter, body.choice, body.guess)
        except VoteRefused as e:
            r = _refused(e)
            r.headers.update(OPEN)
            return r
        await _ready(room)
        if not room._vote_flush_pending:
            room._vote_flush_pending = True
            asyncio.get_running_loop().create_task(_flush(room))
        q = room.question
        return JSONResponse({"question": q.qid, "votes": len(q.votes)}, headers=OPEN)

    async def _flush(room: Room) -> None:
        try:
            await room.flush_votes()
        finally:
            room._vote_flush_pending = False


def _file_routes(router: APIRouter, css: str) -> None:
    """The presenter's take-aways: the room as a static site, and as a file."""
    @router.get("/{room_id}/bundle")
    async def bundle(room: FoundRoom, request: Request, key: str = ""):
        """The presenter: the room as a static site (zip) whose page follows this server."""
        if not _is_presenter(room, key):
            return _forbidden()
        if room.live:
            return _refused(VoteRefused("the request is still running: bundle it once it has finished", 409))
        server = str(request.base_url).rstrip("/")
        data = await run_in_threadpool(bundle_zip, room, server, css, screen_lang(request))
        return Response(data, media_type="application/zip", headers={
            "Content-Disposition": f'attachment; filename="classroom-{room.room_id}.zip"'})

    @router.get("/{room_id}/export")
    async def export(room: FoundRoom, key: str = ""):
        """The presenter: the room as a file: its trace, where it stands, every question's results."""
        if not _is_presenter(room, key):
            return _forbidden()
        return Response(await run_in_threadpool(_export, room), media_type="application/json", headers={
            "Content-Disposition": f'attachment; filename="classroom-{room.room_id}.json"'})


def _export(room: Room) -> bytes:
    with room.lock:
        qs = [q.export() for q in room.questions]
        out = {"schema": 1, "room": room.room_id, "request_id": room.rec.request_id, "stage": room.stage,
               "ask_at": room.question_position(), "revealed": room.revealed, "pick": dict(room.pick),
               "stages": [s.title for s in room._stages], "questions": qs, "trace": room.rec.to_json()}
    return json.dumps(out).encode()

