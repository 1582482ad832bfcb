"""Which fields of an OpenAI-style body this server takes, per endpoint. A field outside
these is refused with a 400 naming it (a silent drop would let a client believe its
`logprobs` or `response_format` had been applied), unless the server runs with
--ignore-unknown-fields, for clients that send extras."""
from __future__ import annotations

# OpenAI's, read by the server (README: the fields table says what each does)
OPENAI = ("model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed", "stop", "n",
          "logprobs", "presence_penalty", "frequency_penalty", "logit_bias")
# OpenAI accepts these and so does this server, without using them: who the end user is, tags, storage
ACCEPTED_UNUSED = ("user", "metadata", "store")
# vLLM's extra sampling parameters, and this server's own (speculation, the trace's capture level)
EXTRAS = ("top_k", "min_p", "min_tokens", "repetition_penalty", "ignore_eos", "speculative", "trace_level")
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
