"""Which fields of an OpenAI-style body this server takes, per endpoint (the models'
fields), and the structured output a checked body asks for. A field outside these is
refused with a 400 naming it (a silent drop would let a client believe its `logprobs` or
`response_format` had been applied), unless the server runs with --ignore-unknown-fields,
for clients that send extras."""
from __future__ import annotations

import json

from app.serving.bodies import Body, ResponseJsonObject, ResponseJsonSchema, fields_of
from engine import Constraint

STRUCTURED_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice")
FIELDS = {endpoint: fields_of(endpoint) for endpoint in ("chat", "completion")}


def unknown_fields(body: dict, endpoint: str) -> list[str]:
    """The body's fields this endpoint does not implement, in the body's order."""
    return [name for name in body if name not in FIELDS[endpoint]]


def constraint(body: Body) -> tuple[Constraint | None, str | None, str | None]:
    """The structured output a checked body asks for: OpenAI's response_format ({"type": "text"},
    {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name", "schema", ...}}) or
    vLLM's guided_json / guided_regex / guided_choice. -> (constraint, problem field, message)."""
    asked = [name for name in STRUCTURED_FIELDS if getattr(body, name) is not None]
    if len(asked) > 1:
        return None, asked[1], f"send one of {', '.join(asked)}: they each constrain the whole answer"
    if not asked:
        return None, None, None
    name, value = asked[0], getattr(body, asked[0])
    if name == "guided_json":
        return Constraint("json_schema", json.dumps(value), name), None, None
    if name == "guided_regex":
        return Constraint("regex", value, name), None, None
    if name == "guided_choice":
        return Constraint("choice", json.dumps(value), name), None, None
    if isinstance(value, ResponseJsonObject):
        return Constraint("json_object"), None, None
    if isinstance(value, ResponseJsonSchema):
        return Constraint("json_schema", json.dumps(value.json_schema.schema_ or {"type": "object"})), None, None
    return None, None, None  # {"type": "text"}
