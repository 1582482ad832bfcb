"""OpenAI-compatible chat completions (and plain completions, for base models) on the same
server as the page, so a plain `curl` or the `openai` SDK drives the engines and the page
can watch the request. A request's `model` picks the engine (the first when absent).

Each request is traced under its completion id, so the page can watch it and /v1/traces
export it: at the level its body asks for (`"trace_level": "full"`, "basic" or "off"), else
at the server's --api-trace-level ("basic": every stage and token, no tensors). Errors come
in OpenAI's shape: {"error": {"message", "type", "param", "code"}}, unknown routes and
wrong methods included.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from app.serving.engine_service import EngineService, Subscription
from app.serving.limits import RequestRefused, client_of
from app.serving.requests import BodyError, Submission, parse_body
from app.serving.served_models import ServedModels

FINISH = {"stop": "stop", "length": "length", "abort": "stop"}


def error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
          code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}}, status)


def refusal(e: ValueError, served) -> JSONResponse:
    """A refused request (bad body, server limits, the engine's own checks) as an OpenAI error.
    served: anything with the server's .limits (an EngineService, ServedModels)."""
    if isinstance(e, RequestRefused):
        return error(e.status, served.limits.shown(str(e)), e.type, e.param, e.code)
    param = e.param if isinstance(e, BodyError) else "messages"  # the engine's: context, KV pool
    return error(400, served.limits.shown(str(e)), param=param)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def read_json(raw: bytes | str) -> dict:
    """A request body as a dict; RequestRefused says why not. Strict JSON: no NaN or
    Infinity (they would reach the sampler), bounded nesting (the parser recurses)."""
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise RequestRefused("the body is not valid JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, int too long, NaN
        raise RequestRefused(f"the body is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(body, dict):
        raise RequestRefused("the body must be a JSON object")
    return body


def prepare(models, body: dict, endpoint: str | None = None) -> tuple[EngineService, Submission]:
    """The checks every way in (HTTP, WebSocket) applies before an engine sees a body:
    the model must be one served (the first when absent; a path or hub id never loads
    anything), then the body's fields and the server's max_tokens cap. -> (engine, submission)"""
    models = ServedModels.of(models)
    service = models.pick(body.get("model"))
    if body.get("trace_level") is None:  # the server's default for API requests (the page sends its own)
        body = {**body, "trace_level": models.limits.api_trace_level}
    return service, parse_body(body, models.limits.max_tokens_cap, endpoint)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it passes `limit` bytes, before reading the rest."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise RequestRefused(f"the body is larger than this server's limit of {limit:,} bytes", status=413)
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise RequestRefused(f"the body is larger than this server's limit of {limit:,} bytes", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


def model_card(service: EngineService) -> dict:
    return {"id": service.model_name, "object": "model", "created": 0, "owned_by": "tokentrace",
            "max_model_len": service.engine.describe().model.max_model_len}


def add_openai_routes(api: FastAPI, served) -> None:
    models = ServedModels.of(served)

    @api.get("/v1/models")
    def list_models() -> dict:
        return {"object": "list", "data": [model_card(s) for s in models]}

    @api.get("/v1/models/{model_id:path}")  # the OpenAI SDK's models.retrieve(); a hub-style id has a "/"
    def retrieve_model(model_id: str):
        service = models.get(model_id)
        if service is None:
            return refusal(RequestRefused(f"the model {model_id[:80]!r} does not exist; this server serves "
                                          f"{', '.join(repr(n) for n in models.names)}", status=404,
                                          param="model", code="model_not_found"), models)
        return model_card(service)

    @api.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _complete(request, models, "chat")

    @api.post("/v1/completions")  # a plain prompt: the way to a base model, which has no chat template
    async def completions(request: Request):
        return await _complete(request, models, "completion")


METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def add_fallback_routes(api: FastAPI, replay: str | None = None) -> None:
    """Every other /v1/... path or method, in OpenAI's error shape: 404 for a path this
    server lacks, 405 (with Allow) for a wrong method on one it has. Register it after the
    /v1 routes and before the page's mount at "/" (whose answer would be {"detail": ...}).
    replay: the request id a replay server serves (no model: every /v1 path is a 404)."""
    @api.api_route("/v1/{rest:path}", methods=METHODS, include_in_schema=False)
    def unknown_route(rest: str, request: Request):
        method, path = request.method, request.url.path
        if replay is not None:
            return error(404, f"no model is loaded: this server replays the recorded trace of {replay} (python -m "
                         "app --replay); the API needs a server started with a model", code="model_not_loaded")
        allowed = sorted({m for r in api.routes if isinstance(r, APIRoute) and r.endpoint is not unknown_route
                          and r.path_regex.match(path) for m in r.methods})
        if allowed:
            answer = error(405, f"{method} is not allowed on {path[:200]}: use {' or '.join(allowed)}",
                           code="method_not_allowed")
            answer.headers["Allow"] = ", ".join(allowed)
            return answer
        return error(404, f"no route {method} {path[:200]}: this server has POST /v1/chat/completions, POST "
                     "/v1/completions, GET /v1/models, GET /v1/models/{model} and GET /v1/traces/{id}",
                     code="not_found")


async def _complete(request: Request, models: ServedModels, endpoint: str):
    rid = f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    try:
        body = read_json(await read_body(request, models.limits.max_body_bytes))
        service, sub = prepare(models, body, endpoint)
        watch = await run_in_threadpool(service.submit, sub, rid, client_of(request))
    except ValueError as e:  # the body, the server's limits, or the engine's checks (context, KV pool)
        return refusal(e, models)
    created = int(time.time())
    stream_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    if body.get("stream"):
        return StreamingResponse(_stream(request, service, watch, rid, created, stream_usage, endpoint),
                                 media_type="text/event-stream")
    try:
        text, reason, usage = await _collect(request, service, watch)
    finally:
        service.unsubscribe(watch)
    if reason is None:  # the client went away
        return error(499, "the client closed the request")
    finish = FINISH.get(reason, reason)
    if endpoint == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "chat.completion" if endpoint == "chat" else "text_completion",
            "created": created, "model": service.model_name, "choices": [choice], "usage": usage}


def _usage(event: dict) -> dict:
    u = event["usage"]
    return {"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"],
            "total_tokens": u["prompt_tokens"] + u["completion_tokens"],
            "prompt_tokens_details": {"cached_tokens": u["cached_tokens"]}}


async def _items(request: Request, service: EngineService, watch: Subscription) -> AsyncIterator[dict]:
    """The request's queue, read off the event loop; aborts it if the client leaves."""
    while True:
        for item in await run_in_threadpool(watch.drain, 0.25):
            yield item
        if await request.is_disconnected():
            await run_in_threadpool(service.abort, watch.request_id)
            return


async def _until_done(request: Request, service: EngineService, watch: Subscription) -> AsyncIterator[dict]:
    """Text outputs, then one {"type": "done", reason, usage} once the last output (the final
    text) has arrived with its usage, or with the engine's finish event (in either order).
    A request traced at level "off" has no finish event: its last output carries the usage."""
    finish, last = None, None
    async for item in _items(request, service, watch):
        if item["type"] == "output":
            yield item
            last = item if item["finished"] else last
        elif item["type"] == "finish":
            finish = item
        elif item["type"] == "error":
            yield item
            return
        if last is not None and (finish is not None or last.get("usage") is not None):
            usage = _usage(finish if finish is not None else last)
            yield {"type": "done", "reason": finish["reason"] if finish else last["finish_reason"], "usage": usage}
            return


async def _collect(request: Request, service: EngineService, watch: Subscription):
    parts = []
    async for item in _until_done(request, service, watch):
        if item["type"] == "output":
            parts.append(item["text"])
        elif item["type"] == "error":
            return "".join(parts), "abort", None
        else:
            return "".join(parts), item["reason"], item["usage"]
    return "".join(parts), None, None


async def _stream(request: Request, service: EngineService, watch: Subscription, rid: str, created: int,
                  include_usage: bool, endpoint: str = "chat") -> AsyncIterator[str]:
    kind = "chat.completion.chunk" if endpoint == "chat" else "text_completion"

    def chunk(text: str | None, finish: str | None = None) -> str:
        if endpoint == "chat":
            delta = {"role": "assistant", "content": ""} if text is None else {"content": text} if text else {}
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return "data: " + json.dumps({"id": rid, "object": kind, "created": created, "model": service.model_name,
                                      "choices": [choice]}) + "\n\n"
    done = False
    try:
        if endpoint == "chat":
            yield chunk(None)  # the assistant's role first, as OpenAI's stream does
        async for item in _until_done(request, service, watch):
            if item["type"] == "output":
                if item["text"]:
                    yield chunk(item["text"])
            elif item["type"] == "done":
                yield chunk("", FINISH.get(item["reason"], item["reason"]))
                if include_usage:
                    yield "data: " + json.dumps({"id": rid, "object": kind, "created": created,
                                                 "model": service.model_name, "choices": [],
                                                 "usage": item["usage"]}) + "\n\n"
                done = True
                break
            elif item["type"] == "error":
                yield "data: " + json.dumps({"error": {"message": item["message"], "type": "server_error",
                                                       "param": None, "code": None}}) + "\n\n"
                break
        yield "data: [DONE]\n\n"
    finally:
        service.unsubscribe(watch)
        if not done:  # the client left (the server cancels this generator): stop the work
            threading.Thread(target=service.abort, args=(rid,), daemon=True).start()
