"""An OpenAI-style chat request body -> what the engine needs, with the checks it passed.
Shared by the page (which shows the body) and the HTTP API."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine import SamplingParams

TRACE_LEVELS = ("full", "basic", "off")


@dataclass
class Submission:
    messages: list[dict]
    params: SamplingParams
    speculative: bool = True
    num_speculative_tokens: int | None = None
    trace_level: str = "full"
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    body: dict | None = None  # as sent, kept with the trace


def build_body(model: str, system: str, user: str, temperature: float, top_k: int, top_p: float,
               max_tokens: int, seed: int | None, speculative: bool, k: int, trace_level: str) -> dict:
    """The page's controls as the JSON body an OpenAI client would send (plus our extras)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return {"model": model, "stream": True, "messages": messages, "temperature": temperature, "top_k": top_k,
            "top_p": top_p, "max_tokens": max_tokens, "seed": seed,
            "speculative": {"enabled": bool(speculative), "num_tokens": k}, "trace_level": trace_level}


def parse_body(body: dict) -> Submission:
    """Raises ValueError (with the checks so far in .checks) when the body is invalid."""
    checks: list[tuple[str, bool, str]] = []

    def fail(name: str, msg: str):
        checks.append((name, False, msg))
        err = ValueError(msg)
        err.checks = checks  # type: ignore[attr-defined]
        raise err

    if not isinstance(body, dict):
        fail("body", "the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        fail("messages", "messages must be a non-empty list")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            fail("messages", "each message needs a role (system, user or assistant) and string content")
    if not any(m["content"].strip() for m in messages if m["role"] == "user"):
        fail("messages", "the user message is empty")
    checks.append(("messages", True, f"{len(messages)} message{'s' if len(messages) != 1 else ''}"))
    try:
        seed = body.get("seed")
        params = SamplingParams(
            temperature=float(body.get("temperature", 1.0)), top_k=int(body.get("top_k") or 0),
            top_p=float(body.get("top_p", 1.0)),
            max_tokens=int(64 if body.get("max_tokens") is None else body["max_tokens"]),
            seed=None if seed is None or seed == "" else int(seed), stop=body.get("stop") or [],
            ignore_eos=bool(body.get("ignore_eos", False)))  # vLLM's extra parameter
    except (TypeError, ValueError) as e:
        fail("sampling", str(e))
    checks.append(("sampling", True, f"temperature {params.temperature:g}, top-k {params.top_k or 'off'}, "
                   f"top-p {params.top_p:g}, max {params.max_tokens} tokens, seed {params.seed}"))
    spec = body.get("speculative") or {}
    level = body.get("trace_level", "full")
    if level not in TRACE_LEVELS:
        fail("trace level", f"trace_level must be one of {', '.join(TRACE_LEVELS)}")
    k = spec.get("num_tokens")
    if k is not None and (not isinstance(k, int) or k < 1):
        fail("speculative", "speculative.num_tokens must be a positive integer")
    return Submission(messages, params, bool(spec.get("enabled", True)), k, level, checks, body)
