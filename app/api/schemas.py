"""The schema of a body a route reads itself. Our POST routes read their raw body (a size
limit before the rest arrives, strict JSON, any content type, as curl sends it) and check
it with a pydantic model; `request_body` tells /openapi.json which model that is, and
`add_body_schemas` puts the models' schemas among its components (where /docs finds them).
A parameter FastAPI checks itself (a query's or a path's) is refused in OpenAI's shape."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

REF = "#/components/schemas/{model}"


def request_body(model: type[BaseModel], description: str | None = None) -> dict:
    """A route's openapi_extra: its JSON body is a `model`."""
    body = {"required": True, "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}}
    return {"requestBody": {**body, **({"description": description} if description else {})}}


def add_body_schemas(api: FastAPI, *models: type[BaseModel]) -> None:
    """The models (and the models they hold) in the app's OpenAPI components."""
    build = api.openapi

    def openapi() -> dict:
        if api.openapi_schema is None:
            schema = build()
            _, top = models_json_schema([(m, "validation") for m in models], ref_template=REF)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(top.get("$defs", {}))
        return api.openapi_schema
    api.openapi = openapi


def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
    """A query or path parameter FastAPI refused (?v=abc): OpenAI's shape and status, as vLLM
    answers, instead of FastAPI's 422 {"detail": [...]}."""
    err = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid request"}
    name = str(err["loc"][-1]) if err["loc"] else None
    message = f"{name}: {err['msg']}" if name else str(err["msg"])
    return JSONResponse({"error": {"message": message[:300], "type": "invalid_request_error", "param": name,
                                   "code": None}}, 400)


def add_validation_errors(api: FastAPI) -> None:
    api.add_exception_handler(RequestValidationError, _invalid)
