"""A body the models refused, said the way this server always said it: one message naming
the first failing field (in parse_body's order), the field as OpenAI's `param`, and the
check the page shows it under."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from pydantic import ValidationError

from app.serving.bodies import MAX_LOGIT_BIAS, MAX_STOPS, MODELS, ORDER

CHECKS = {"user": "body", "metadata": "body", "store": "body", "stream": "body", "stream_options": "body",
          "prompt": "prompt", "messages": "messages", "speculative": "speculative",
          "trace_level": "trace level"}  # every other field: "sampling"
INTEGERS = {"max_tokens", "max_completion_tokens", "top_k", "seed", "n", "min_tokens", "top_logprobs"}
NUMBERS = {"temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"}
BOOLEANS = ("ignore_eos", "echo", "store", "stream")
FIXED = {
    "user": "user must be a string",
    "model": "model must be a string: a served model's name",
    "metadata": "metadata must be an object of at most 16 string values (keys up to 64 characters)",
    "stop": f"stop must be a non-empty string or a list of at most {MAX_STOPS} of them",
    "trace_level": "trace_level must be one of full, basic, off",
    "prompt": "prompt must be a string or a list of token ids (integers >= 0): one prompt a request",
    "guided_json": "guided_json must be a JSON schema (an object, or its JSON text)",
    "guided_regex": "guided_regex must be a non-empty string (a regular expression)",
    "guided_choice": "guided_choice must be a list of 1 to 64 non-empty strings",
}
RANGES = ("greater_than_equal", "less_than_equal", "greater_than", "less_than", "finite_number")


@dataclass
class Problem:
    check: str  # the page's check it fails
    message: str
    param: str | None
    code: str | None = None


def first_problem(e: ValidationError, endpoint: str) -> Problem:
    errors = e.errors(include_url=False)
    extra = [err for err in errors if err["type"] == "extra_forbidden"]
    if extra:  # a field this endpoint does not implement: named first, as the body has it
        name = str(extra[0]["loc"][0])
        return Problem("body", unknown_message(name, endpoint), name[:80], "unknown_parameter")
    if any(not err["loc"] for err in errors):
        return Problem("body", "the body must be a JSON object", None)
    err = min(errors, key=lambda x: ORDER.index(x["loc"][0]) if x["loc"][0] in ORDER else len(ORDER))
    name = str(err["loc"][0])
    said = _turn(errors) if name == "messages" else None
    return Problem(CHECKS.get(name, "sampling"), (said or _message(err, name, endpoint))[:200], name)


def _turn(errors: list[dict]) -> str | None:
    """What is wrong with one message, where the errors say it more closely than "each message
    needs ...": a role no chat template has, or a content part that is not text."""
    for err in errors:
        loc, value = err["loc"], err.get("input")
        if err["type"] == "literal_error" and len(loc) == 3 and loc[0] == "messages" and loc[2] == "role":
            return (f"messages[{loc[1]}]: role {str(value)[:40]!r} is not one this server takes (system, developer, "
                    "user or assistant; it runs no tools)")
        if err["type"] == "literal_error" and len(loc) == 6 and loc[2] == "content" and loc[-1] == "type":
            return (f"messages[{loc[1]}].content[{loc[4]}]: a part of type {str(value)[:40]!r}: this server's models "
                    "read text only (parts {\"type\": \"text\", \"text\": ...})")
    return None


def unknown_message(name: str, endpoint: str) -> str:
    where = "POST /v1/chat/completions" if endpoint == "chat" else "POST /v1/completions"
    return (f"unrecognized request argument: {name[:80]!r} is not a field {where} implements on this server; "
            "remove it (or start the server with --ignore-unknown-fields to drop unknown fields)")


def _message(err: dict, name: str, endpoint: str) -> str:
    loc, value = err["loc"], err.get("input")
    if err["type"] == "string_unicode" or "surrogates not allowed" in err.get("msg", ""):  # JSON's "\ud800"
        what = "each message's content" if name == "messages" else name
        return f"{what} must be valid Unicode text: it holds a lone surrogate (\\ud800-\\udfff), which is no character"
    if name in FIXED:
        return FIXED[name]
    if name in INTEGERS or name in NUMBERS or (name == "logprobs" and endpoint == "completion"):
        return _number(name, value, err["type"] in RANGES, name in NUMBERS, endpoint)
    if name in BOOLEANS:
        return f"{name} must be true or false"
    if name == "logprobs":
        return "logprobs must be true or false (top_logprobs says how many alternatives)"
    if name == "messages":
        return ("messages must be a non-empty list" if len(loc) == 1 else
                "each message needs a role (system, user or assistant) and string content")
    if name == "logit_bias":
        if len(loc) == 1:
            return f"logit_bias must be an object of at most {MAX_LOGIT_BIAS} token ids -> bias"
        if loc[-1] == "[key]":
            return f"logit_bias keys are token ids (integers as strings), got {str(loc[1])[:20]!r}"
        return f"logit_bias values must be numbers in [-100, 100], got {value!r}"
    if name == "speculative":
        return ("speculative.num_tokens must be an integer in [1, 64]" if loc[1:2] == ("num_tokens",) else
                "speculative must be an object {enabled: bool, num_tokens: int}")
    if name == "stream_options":
        return ("stream_options.include_usage must be true or false" if loc[1:2] == ("include_usage",) else
                "stream_options must be an object")
    if name == "response_format" and len(loc) > 2 and loc[1] == "json_schema":
        return "response_format.json_schema must be an object {name, schema: a JSON schema object, strict}"
    return 'response_format must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", ' \
           '"json_schema": {...}}'


def _number(name: str, value, out_of_range: bool, real: bool, endpoint: str) -> str:
    """What parse_body always said of a number: its type, else its range."""
    if not out_of_range:
        return f"{name} must be {'a number' if real else 'an integer'}, got {value!r}"
    return f"{name} must be {bounds(name, endpoint, value)}, got {value!r}"


def bounds(name: str, endpoint: str, value=None) -> str:
    """"in [lo, hi]", "at least lo" (hi only keeps it an int32: "at most hi" for a value above
    it) or "a 64-bit integer" (seed), as the model's JSON schema has them."""
    if name == "seed":
        return "a 64-bit integer"
    kinds = _schema(endpoint)["properties"][name]["anyOf"]
    ranged = next(k for k in kinds if "minimum" in k)
    lo, hi = ranged["minimum"], ranged["maximum"]
    if name == "max_tokens":
        lo = 1  # 0 only scores a prompt (completions with echo)
    if hi >= 2 ** 31:
        return f"at most {hi:,}" if isinstance(value, (int, float)) and value > hi else f"at least {lo:g}"
    return f"in [{lo:g}, {hi:g}]"


@functools.cache
def _schema(endpoint: str) -> dict:
    return MODELS[endpoint].model_json_schema()
