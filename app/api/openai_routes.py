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

from app.api.choices import ChunkWriter, Choice, chat_choice, completion_choice, usage
from app.api.logprobs import TokenText
from app.api.schemas import add_body_schemas, request_body
from app.serving.bodies import ChatCompletionRequest, CompletionRequest
from app.serving.engine_service import EngineService, Subscription
from app.serving.fields import STRUCTURED_FIELDS
from app.serving.limits import RequestRefused, client_of
from app.serving.requests import BodyError, Submission, parse_body
from app.serving.served_models import ServedModels
from engine import LLMEngine

def error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
          code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}}, status)


def refusal(e: ValueError, served, endpoint: str = "chat") -> JSONResponse:
    """A refused request (bad body, server limits, the engine's own checks) as an OpenAI error.
    served: anything with the server's .limits (an EngineService, ServedModels); endpoint: "chat"
    or "completion" (the engine's checks of the prompt name `messages` or `prompt`)."""
    if isinstance(e, RequestRefused):
        return error(e.status, served.limits.shown(str(e)), e.type, e.param, e.code)
    if isinstance(e, BodyError):
        return error(400, served.limits.shown(str(e)), param=e.param, code=e.code)
    first = str(e).split(" ")[0].rstrip(":")  # the engine's checks of a field name it first
    prompt = "messages" if endpoint == "chat" else "prompt"
    param = first if first in ("logit_bias", *STRUCTURED_FIELDS) else prompt  # else: its ids, context, KV pool
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
    return service, parse_body(body, models.limits.max_tokens_cap, endpoint, models.limits.ignore_unknown_fields)


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

    @api.post("/v1/chat/completions", openapi_extra=request_body(ChatCompletionRequest))
    async def chat_completions(request: Request):
        """OpenAI's chat completions: messages through the model's chat template."""
        return await _complete(request, models, "chat")

    @api.post("/v1/completions", openapi_extra=request_body(CompletionRequest))
    async def completions(request: Request):
        """A plain prompt: the way to a base model, which has no chat template."""
        return await _complete(request, models, "completion")
    add_body_schemas(api, ChatCompletionRequest, CompletionRequest)


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
        return refusal(e, models, endpoint)
    created = int(time.time())
    choices = {cid: Choice(i) for i, cid in enumerate(LLMEngine.choice_ids(rid, sub.params.n))}
    text = TokenText(service.engine.tokenizer)
    head = {"id": rid, "object": "chat.completion" if endpoint == "chat" else "text_completion",
            "created": created, "model": service.model_name}
    if body.get("stream"):
        stream_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        head["object"] = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
        writer = ChunkWriter(endpoint, sub, text)
        return StreamingResponse(_stream(request, service, watch, head, choices, writer, stream_usage),
                                 media_type="text/event-stream")
    try:
        done = await _collect(request, service, watch, choices)
    finally:
        service.unsubscribe(watch)
    if not done:  # the client went away
        return error(499, "the client closed the request")
    shape = chat_choice if endpoint == "chat" else completion_choice
    ordered = sorted(choices.values(), key=lambda c: c.index)
    for c in ordered[1:]:  # the prompt's logprobs (echo) come with the first choice: the same for every one
        c.prompt_ids, c.prompt_logprobs = ordered[0].prompt_ids, ordered[0].prompt_logprobs
    return {**head, "choices": [shape(c, sub, text) for c in ordered], "usage": usage(ordered, sub)}


async def _items(request: Request, service: EngineService, watch: Subscription) -> AsyncIterator[dict]:
    """The request's queue, read off the event loop; aborts it (every choice) if the client leaves."""
    while True:
        for item in await run_in_threadpool(watch.drain, 0.25):
            yield item
        if await request.is_disconnected():
            await run_in_threadpool(_abort_all, service, [watch.request_id] + [s.request_id for s in watch.siblings])
            return


def _abort_all(service: EngineService, request_ids: list[str]) -> None:
    for rid in request_ids:
        service.abort(rid)


async def _until_done(request: Request, service: EngineService, watch: Subscription,
                      choices: dict[str, Choice]) -> AsyncIterator[dict]:
    """Text outputs, then one {"type": "done", request_id, reason, usage} per choice once its
    last output (the final text) has arrived with its usage, or with the engine's finish event
    (in either order); it ends when every choice is done. A request traced at level "off" has
    no finish event: its last output carries the usage."""
    finish: dict[str, dict] = {}
    last: dict[str, dict] = {}
    async for item in _items(request, service, watch):
        rid = item.get("request_id")
        if rid not in choices or choices[rid].reason is not None:
            continue
        if item["type"] == "output":
            yield item
            if item["finished"]:
                last[rid] = item
        elif item["type"] == "finish":
            finish[rid] = item
        elif item["type"] == "error":
            yield item
            return
        if rid in last and (rid in finish or last[rid].get("usage") is not None):
            end = finish.get(rid) or last[rid]
            c = choices[rid]
            c.reason, c.usage = end["reason"] if rid in finish else end["finish_reason"], end["usage"]
            yield {"type": "done", "request_id": rid, "reason": c.reason}
            if all(c.reason is not None for c in choices.values()):
                return


async def _collect(request: Request, service: EngineService, watch: Subscription,
                   choices: dict[str, Choice]) -> bool:
    """Fill the choices; False if the client went away first."""
    async for item in _until_done(request, service, watch, choices):
        if item["type"] == "output":
            choices[item["request_id"]].add(item)
        elif item["type"] == "error":
            for c in choices.values():
                c.reason = c.reason or "abort"
            return True
    return all(c.reason is not None for c in choices.values())


def _sse(payload: dict) -> str:
    return "data: " + json.dumps(payload) + "\n\n"


async def _stream(request: Request, service: EngineService, watch: Subscription, head: dict,
                  choices: dict[str, Choice], writer: ChunkWriter, include_usage: bool) -> AsyncIterator[str]:
    done = False
    try:
        for c in choices.values():  # the assistant's role first, as OpenAI's stream does
            opening = writer.first(c.index)
            if opening is not None:
                yield _sse({**head, "choices": [opening]})
        async for item in _until_done(request, service, watch, choices):
            if item["type"] == "output":
                for choice in writer.output(choices[item["request_id"]].index, item):
                    yield _sse({**head, "choices": [choice]})
            elif item["type"] == "done":
                yield _sse({**head, "choices": [writer.done(choices[item["request_id"]].index, item["reason"])]})
            elif item["type"] == "error":
                yield _sse({"error": {"message": item["message"], "type": "server_error", "param": None,
                                      "code": None}})
                break
        else:
            done = all(c.reason is not None for c in choices.values())
            if done and include_usage:
                yield _sse({**head, "choices": [], "usage": usage(list(choices.values()), writer.sub)})
        yield "data: [DONE]\n\n"
    finally:
        service.unsubscribe(watch)
        if not done:  # the client left (the server cancels this generator): stop the work
            threading.Thread(target=_abort_all, args=(service, list(choices)), daemon=True).start()
