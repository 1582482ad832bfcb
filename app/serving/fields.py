"""Which fields of an OpenAI-style body this server takes, per endpoint. A field outside
these is refused with a 400 naming it (a silent drop would let a client believe its
`logprobs` or `response_format` had been applied), unless the server runs with
--ignore-unknown-fields, for clients that send extras."""
from __future__ import annotations

import json

from engine import Constraint

# OpenAI's, read by the server (README: the fields table says what each does)
OPENAI = ("model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed", "stop", "n",
          "logprobs", "presence_penalty", "frequency_penalty", "logit_bias", "response_format")
# OpenAI accepts these and so does this server, without using them: who the end user is, tags, storage
ACCEPTED_UNUSED = ("user", "metadata", "store")
# vLLM's extra sampling parameters, and this server's own (speculation, the trace's capture level)
EXTRAS = ("top_k", "min_p", "min_tokens", "repetition_penalty", "ignore_eos", "speculative", "trace_level",
          "guided_json", "guided_regex", "guided_choice")
STRUCTURED_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice")
FIELDS = {
    "chat": frozenset(OPENAI + ACCEPTED_UNUSED + EXTRAS + ("messages", "max_completion_tokens", "top_logprobs")),
    "completion": frozenset(OPENAI + ACCEPTED_UNUSED + EXTRAS + ("prompt", "echo")),
}


def unknown_fields(body: dict, endpoint: str) -> list[str]:
    """The body's fields this endpoint does not implement, in the body's order."""
    return [name for name in body if name not in FIELDS[endpoint]]


def unknown_message(name: str, endpoint: str) -> str:
    where = "POST /v1/chat/completions" if endpoint == "chat" else "POST /v1/completions"
    return (f"unrecognized request argument: {name[:80]!r} is not a field {where} implements on this server; "
            "remove it (or start the server with --ignore-unknown-fields to drop unknown fields)")


def unused_problem(body: dict) -> tuple[str, str] | None:
    """(field, message) when user, metadata or store has the wrong type (OpenAI checks them too)."""
    user, metadata, store = body.get("user"), body.get("metadata"), body.get("store")
    if user is not None and not isinstance(user, str):
        return "user", "user must be a string"
    if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= 16 and all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in metadata.items())):
        return "metadata", "metadata must be an object of at most 16 string values (keys up to 64 characters)"
    if store is not None and not isinstance(store, bool):
        return "store", "store must be true or false"
    return None


def constraint(body: dict) -> tuple[Constraint | None, str | None, str | None]:
    """The structured output a body asks for: OpenAI's response_format ({"type": "text"},
    {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name", "schema", ...}}) or
    vLLM's guided_json / guided_regex / guided_choice. -> (constraint, problem field, message)."""
    asked = [name for name in STRUCTURED_FIELDS if body.get(name) is not None]
    if len(asked) > 1:
        return None, asked[1], f"send one of {', '.join(asked)}: they each constrain the whole answer"
    if not asked:
        return None, None, None
    name, value = asked[0], body[asked[0]]
    if name == "guided_json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return None, name, "guided_json must be a JSON schema (an object, or its JSON text)"
        if not isinstance(value, dict):
            return None, name, "guided_json must be a JSON schema (an object, or its JSON text)"
        return Constraint("json_schema", json.dumps(value), name), None, None
    if name == "guided_regex":
        if not isinstance(value, str) or not value:
            return None, name, "guided_regex must be a non-empty string (a regular expression)"
        return Constraint("regex", value, name), None, None
    if name == "guided_choice":
        if not (isinstance(value, list) and 0 < len(value) <= 64 and all(isinstance(v, str) and v for v in value)):
            return None, name, "guided_choice must be a list of 1 to 64 non-empty strings"
        return Constraint("choice", json.dumps(value), name), None, None
    return _response_format(value)


def _response_format(value) -> tuple[Constraint | None, str | None, str | None]:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None, None, None
    if kind == "json_object":
        return Constraint("json_object"), None, None
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict) \
                or not isinstance(spec.get("name", ""), str):
            return None, "response_format", ("response_format.json_schema must be an object "
                                             "{name, schema: a JSON schema object, strict}")
        return Constraint("json_schema", json.dumps(spec.get("schema") or {"type": "object"})), None, None
    return None, "response_format", ('response_format must be {"type": "text"}, {"type": "json_object"} or '
                                     '{"type": "json_schema", "json_schema": {...}}')
