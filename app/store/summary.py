"""A trace's line in the library: the prompt's first words, its tokens, its capture level."""
from __future__ import annotations

import time

from app.serving.recording import Recording
from app.store.repository import TraceMeta

PROMPT_CHARS = 200  # what the list shows and the search reads


def prompt_words(body: dict | None, events: list[dict] | None = None) -> str:
    """The prompt (a completion's) or the last user message (a chat's), whitespace folded; a
    prompt of token ids: their text as the trace's request.arrive has it (events), else none."""
    body = body or {}
    text = body.get("prompt")
    if isinstance(text, list):
        text = text[0] if text and isinstance(text[0], str) else ""
        arrive = next((e for e in events or () if e.get("type") == "request.arrive"), None)
        if not text and isinstance((arrive or {}).get("prompt"), str):
            text = arrive["prompt"]
    if not isinstance(text, str):
        text = ""
        for m in reversed(body.get("messages") or []):
            if isinstance(m, dict) and m.get("role") == "user":
                content = m.get("content")
                text = content if isinstance(content, str) else " ".join(
                    p.get("text", "") for p in content or [] if isinstance(p, dict))
                break
    return " ".join(text.split())[:PROMPT_CHARS]


def level_of(body: dict | None, events: list[dict]) -> str | None:
    arrive = next((e for e in events if e.get("type") == "request.arrive"), None)
    return (arrive or {}).get("trace_level") or (body or {}).get("trace_level")


def tokens_of(outputs: list[dict]) -> int:
    usage = next((o.get("usage") for o in reversed(outputs) if o.get("usage")), None) or {}
    if usage:
        return int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
    return sum(o.get("token_id", -1) >= 0 for o in outputs)


def started_meta(request_id: str, model: str | None, body: dict | None, created: float | None = None) -> TraceMeta:
    return TraceMeta(request_id, model, created or time.time(), prompt_words(body),
                     capture_level=(body or {}).get("trace_level"))


def finished_meta(rec: Recording, created: float, pinned: bool) -> TraceMeta:
    return TraceMeta(rec.request_id, rec.model.get("name"), created, prompt_words(rec.body, rec.events),
                     tokens_of(rec.outputs), level_of(rec.body, rec.events), pinned)
