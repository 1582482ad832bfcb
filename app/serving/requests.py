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
    prompt: str | None = None  # a plain prompt (completions; base models): sent as is, no chat template


def build_body(model: str, system: str, user: str, temperature: float, top_k: int, top_p: float,
               max_tokens: int, seed: int | None, speculative: bool, k: int, trace_level: str,
               plain: bool = False) -> dict:
    """The page's controls as the JSON body an OpenAI client would send (plus our extras).
    plain: a completion body (a base model, no chat template): the prompt alone, no system."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    text = {"prompt": user} if plain else {"messages": messages}
    return {"model": model, "stream": True, **text, "temperature": temperature, "top_k": top_k,
            "top_p": top_p, "max_tokens": max_tokens, "seed": seed,
            "speculative": {"enabled": bool(speculative), "num_tokens": k}, "trace_level": trace_level}


class BodyError(ValueError):
    """An invalid body: the message says what to fix; `param` names the field (OpenAI's
    error shape) and `checks` the checks so far (the page shows them)."""

    def __init__(self, message: str, param: str | None, checks: list[tuple[str, bool, str]]) -> None:
        super().__init__(message)
        self.param = param
        self.checks = checks


ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
SEED_RANGE = (-(2 ** 63), 2 ** 64 - 1)  # what torch.Generator.manual_seed takes
MIN_TEMPERATURE = 1e-5  # below this, sampling is greedy (as in vLLM): 1/T would overflow the logits


def _text(value) -> str | None:
    """A message's content as one string: a string, or a list of {"type": "text"} parts."""
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in value):
        value = "".join(p["text"] for p in value)
    if not isinstance(value, str):
        return None
    try:
        value.encode("utf-8")  # JSON can carry lone surrogates; the tokenizer cannot
    except UnicodeEncodeError:
        return None
    return value


def parse_body(body: dict, max_tokens_cap: int | None = None, endpoint: str | None = None) -> Submission:
    """Raises BodyError (a ValueError, with the checks so far in .checks) when the body is
    invalid. Types are checked strictly, so nothing malformed reaches the engine thread.
    endpoint: "chat" (messages), "completion" (a plain prompt), None: whichever the body has."""
    checks: list[tuple[str, bool, str]] = []

    def fail(name: str, msg: str, param: str | None = None):
        checks.append((name, False, msg))
        raise BodyError(msg, param, checks)

    def number(name: str, default, lo: float, hi: float, integer: bool = False, bounds: str | None = None):
        value = body.get(name)
        if value is None:
            return default
        # bool is an int in Python, and 1.5 would be truncated: refuse both for integers
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or (integer and isinstance(value, float) and not value.is_integer()):
            fail("sampling", f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}"[:200], name)
        if not lo <= value <= hi:  # NaN fails this too
            bounds = bounds or (f"at least {lo:g}" if hi >= 2 ** 31 else f"in [{lo:g}, {hi:g}]")
            fail("sampling", f"{name} must be {bounds}, got {value!r}"[:200], name)
        return int(value) if integer else float(value)

    if not isinstance(body, dict):
        fail("body", "the body must be a JSON object")
    if endpoint is None:
        endpoint = "completion" if "prompt" in body and "messages" not in body else "chat"
    prompt = None
    if endpoint == "completion":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:  # OpenAI's batch form, with one prompt
            prompt = prompt[0]
        if not isinstance(prompt, str) or _text(prompt) is None:
            fail("prompt", "prompt must be a string", "prompt")
        if not prompt.strip():
            fail("prompt", "the prompt is empty", "prompt")
        checks.append(("prompt", True, f"a plain prompt of {len(prompt):,} characters (no chat template)"))
        messages = []
    else:
        messages = _messages(body, checks, fail)
    if body.get("n") not in (None, 1):
        fail("sampling", "only n = 1 is supported", "n")
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop or []
    if not isinstance(stop, list) or len(stop) > 8 or not all(isinstance(s, str) and s for s in stop):
        fail("sampling", "stop must be a non-empty string or a list of at most 8 of them", "stop")
    if not isinstance(body.get("ignore_eos", False), bool):
        fail("sampling", "ignore_eos must be true or false", "ignore_eos")
    max_tokens = number("max_tokens", min(64, max_tokens_cap or 64), 1, 2 ** 31, integer=True)
    if max_tokens_cap is not None and max_tokens > max_tokens_cap:
        fail("sampling", f"max_tokens {max_tokens} is above this server's cap of {max_tokens_cap}", "max_tokens")
    temperature = number("temperature", 1.0, 0.0, 2.0)
    top_k, top_p = number("top_k", 0, -1, 2 ** 31, integer=True), number("top_p", 1.0, 0.0, 1.0)
    seed = number("seed", None, *SEED_RANGE, integer=True, bounds="a 64-bit integer")
    try:
        params = SamplingParams(temperature=0.0 if temperature < MIN_TEMPERATURE else temperature, top_k=top_k,
                                top_p=top_p, max_tokens=max_tokens, seed=seed, stop=stop,
                                ignore_eos=body.get("ignore_eos", False))  # ignore_eos: vLLM's extra parameter
    except ValueError as e:  # the remaining rules (top_p > 0): the message names the field
        fail("sampling", str(e), str(e).split(" ")[0])
    checks.append(("sampling", True, f"temperature {params.temperature:g}, top-k {params.top_k or 'off'}, "
                   f"top-p {params.top_p:g}, max {params.max_tokens} tokens, "
                   + ("greedy: the argmax, the same every run (no seed needed)" if params.temperature == 0
                      else f"seed {params.seed}" if params.seed is not None else "no seed (a random draw)")))
    spec = body.get("speculative") or {}
    if not isinstance(spec, dict) or not isinstance(spec.get("enabled", True), bool):
        fail("speculative", "speculative must be an object {enabled: bool, num_tokens: int}", "speculative")
    level = body.get("trace_level", "full")
    if level not in TRACE_LEVELS:
        fail("trace level", f"trace_level must be one of {', '.join(TRACE_LEVELS)}", "trace_level")
    k = spec.get("num_tokens")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 64):
        fail("speculative", "speculative.num_tokens must be an integer in [1, 64]", "speculative")
    for name in ("stream", "stream_options"):
        if body.get(name) is not None and not isinstance(body[name], dict if name == "stream_options" else bool):
            fail("body", f"{name} must be {'an object' if name == 'stream_options' else 'true or false'}", name)
    return Submission(messages, params, spec.get("enabled", True), k, level, checks, body, prompt)


def _messages(body: dict, checks: list, fail) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        fail("messages", "messages must be a non-empty list", "messages")
    clean = []
    for m in messages:
        role = ROLES.get(m.get("role")) if isinstance(m, dict) and isinstance(m.get("role"), str) else None
        content = _text(m.get("content")) if isinstance(m, dict) else None
        if role is None or content is None:
            fail("messages", "each message needs a role (system, user or assistant) and string content",
                 "messages")
        clean.append({"role": role, "content": content})
    if not any(m["content"].strip() for m in clean if m["role"] == "user"):
        fail("messages", "the user message is empty", "messages")
    checks.append(("messages", True, f"{len(clean)} message{'s' if len(clean) != 1 else ''}"))
    return clean
