"""The schema of a body a route reads itself. Our POST routes read their raw body (a size
limit before the rest arrives, strict JSON, any content type, as curl sends it) and check
it with a pydantic model; `request_body` tells /openapi.json which model that is, and
`add_body_schemas` puts the models' schemas among its components (where /docs finds them)."""
from __future__ import annotations

from fastapi import FastAPI
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
