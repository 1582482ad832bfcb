"""An OpenAI-style chat request body -> what the engine needs, with the checks it passed.
Shared by the page (which shows the body) and the HTTP API."""
from __future__ import annotations

from dataclasses import dataclass, field

from app.serving.fields import constraint, unknown_fields, unknown_message, unused_problem
from engine import MAX_LOGPROBS, SamplingParams

TRACE_LEVELS = ("full", "basic", "off")


@dataclass
class Submission:
    messages: list[dict]
    params: SamplingParams
    speculative: bool = True
    num_speculative_tokens: int | None = None
    trace_level: str = "full"
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    body: dict | None = None  # as sent (less unknown fields dropped by --ignore-unknown-fields), kept with the trace
    prompt: str | None = None  # a plain prompt (completions; base models): sent as is, no chat template
    echo: bool = False  # completions: the prompt comes back before the completion (its logprobs too, if asked)
    score_only: bool = False  # completions with echo and max_tokens 0: the prompt alone (one token is drawn, unsent)


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

    def __init__(self, message: str, param: str | None, checks: list[tuple[str, bool, str]],
                 code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.checks = checks
        self.code = code


ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
SEED_RANGE = (-(2 ** 63), 2 ** 64 - 1)  # what torch.Generator.manual_seed takes
MAX_CHOICES = 8  # n: choices from one prompt
MAX_LOGIT_BIAS = 300  # token ids one request may bias
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


def parse_body(body: dict, max_tokens_cap: int | None = None, endpoint: str | None = None,
               ignore_unknown: bool = False) -> Submission:
    """Raises BodyError (a ValueError, with the checks so far in .checks) when the body is
    invalid. Types are checked strictly, so nothing malformed reaches the engine thread.
    endpoint: "chat" (messages), "completion" (a plain prompt), None: whichever the body has.
    A field the endpoint does not implement is refused (app/serving/fields.py), or dropped
    with ignore_unknown (the server's --ignore-unknown-fields)."""
    checks: list[tuple[str, bool, str]] = []

    def fail(name: str, msg: str, param: str | None = None, code: str | None = None):
        checks.append((name, False, msg))
        raise BodyError(msg, param, checks, code)

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
    unknown = unknown_fields(body, endpoint)
    if unknown and not ignore_unknown:
        fail("body", unknown_message(unknown[0], endpoint), unknown[0][:80], "unknown_parameter")
    if unknown:
        checks.append(("body", True, f"ignored (--ignore-unknown-fields): {', '.join(unknown)}"[:200]))
        # the trace keeps the body the engine read: a replay or the page parses it again without the flag
        body = {k: v for k, v in body.items() if k not in unknown}
    problem = unused_problem(body)
    if problem is not None:
        fail("body", problem[1], problem[0])
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
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop or []
    if not isinstance(stop, list) or len(stop) > 8 or not all(isinstance(s, str) and s for s in stop):
        fail("sampling", "stop must be a non-empty string or a list of at most 8 of them", "stop")
    if not isinstance(body.get("ignore_eos", False), bool):
        fail("sampling", "ignore_eos must be true or false", "ignore_eos")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        fail("sampling", "echo must be true or false", "echo")
    length = _length_field(body, fail)
    # echo with max_tokens 0 scores the prompt alone (evaluation harnesses): one token is drawn, not sent
    score_only = echo and type(body.get(length)) is int and body.get(length) == 0
    max_tokens = 1 if score_only else number(length, min(64, max_tokens_cap or 64), 1, 2 ** 31, integer=True)
    if max_tokens_cap is not None and max_tokens > max_tokens_cap:
        fail("sampling", f"{length} {max_tokens} is above this server's cap of {max_tokens_cap}", length)
    temperature = number("temperature", 1.0, 0.0, 2.0)
    top_k, top_p = number("top_k", 0, -1, 2 ** 31, integer=True), number("top_p", 1.0, 0.0, 1.0)
    min_p = number("min_p", 0.0, 0.0, 1.0)
    seed = number("seed", None, *SEED_RANGE, integer=True, bounds="a 64-bit integer")
    logprobs, prompt_logprobs = _logprobs(body, endpoint, echo, number, fail)
    n = number("n", 1, 1, MAX_CHOICES, integer=True)
    structured, problem, message = constraint(body)
    if problem is not None:
        fail("sampling", message, problem)
    penalties = {"presence_penalty": number("presence_penalty", 0.0, -2.0, 2.0),
                 "frequency_penalty": number("frequency_penalty", 0.0, -2.0, 2.0),
                 "repetition_penalty": number("repetition_penalty", 1.0, 0.0, 2 ** 31),
                 "min_tokens": number("min_tokens", 0, 0, 2 ** 31, integer=True),
                 "logit_bias": _logit_bias(body.get("logit_bias"), fail)}
    try:
        params = SamplingParams(temperature=0.0 if temperature < MIN_TEMPERATURE else temperature, top_k=top_k,
                                top_p=top_p, min_p=min_p, max_tokens=max_tokens, seed=seed, stop=stop,
                                ignore_eos=body.get("ignore_eos", False),  # ignore_eos: vLLM's extra parameter
                                logprobs=logprobs, prompt_logprobs=prompt_logprobs, n=n, structured=structured,
                                **penalties)
    except ValueError as e:  # the remaining rules (top_p > 0): the message names the field
        fail("sampling", str(e), str(e).split(" ")[0])
    checks.append(("sampling", True, f"temperature {params.temperature:g}, top-k {params.top_k or 'off'}, "
                   f"top-p {params.top_p:g}, max {params.max_tokens} tokens, "
                   + ("greedy: the argmax, the same every run (no seed needed)" if params.temperature == 0
                      else f"seed {params.seed}" if params.seed is not None else "no seed (a random draw)")
                   + (f", {n} choices (the prompt prefilled once)" if n > 1 else "")
                   + (f", constrained: {structured.kind.replace('_', ' ')}" if structured else "")
                   + "".join(f", {name.replace('_', ' ')} {value}" for name, value in penalties.items()
                             if value and (name != "repetition_penalty" or value != 1.0))))
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
    return Submission(messages, params, spec.get("enabled", True), k, level, checks, body, prompt, echo, score_only)


def _logit_bias(value, fail) -> dict[int, float]:
    """OpenAI's logit_bias: {"token id": bias in [-100, 100]} (JSON keys are strings)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_LOGIT_BIAS:
        fail("sampling", f"logit_bias must be an object of at most {MAX_LOGIT_BIAS} token ids -> bias", "logit_bias")
    bias = {}
    for key, b in value.items():
        if not (isinstance(key, str) and key.isdigit() and len(key) < 10):
            fail("sampling", f"logit_bias keys are token ids (integers as strings), got {key[:20]!r}", "logit_bias")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100 <= b <= 100:
            fail("sampling", f"logit_bias values must be numbers in [-100, 100], got {b!r}"[:200], "logit_bias")
        bias[int(key)] = float(b)
    return bias


def _length_field(body: dict, fail) -> str:
    """Which field sets the completion's length: max_completion_tokens (OpenAI's newer name,
    chat) or max_tokens; both only when they agree."""
    new, old = body.get("max_completion_tokens"), body.get("max_tokens")
    if new is not None and old is not None and new != old:
        fail("sampling", f"max_completion_tokens ({new!r}) and max_tokens ({old!r}) disagree: send one of them"[:200],
             "max_completion_tokens")
    return "max_completion_tokens" if new is not None else "max_tokens"


def _logprobs(body: dict, endpoint: str, echo: bool, number, fail) -> tuple[int | None, int | None]:
    """(logprobs per new token, logprobs per prompt token) as SamplingParams takes them.
    Chat: logprobs true/false and top_logprobs 0..20 (which needs logprobs true). Completions:
    logprobs an integer 0..20 (the top count), with echo the prompt's tokens' too."""
    if endpoint == "completion":
        top = number("logprobs", None, 0, MAX_LOGPROBS, integer=True)
        return top, top if echo and top is not None else None
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        fail("sampling", "logprobs must be true or false (top_logprobs says how many alternatives)", "logprobs")
    top = number("top_logprobs", None, 0, MAX_LOGPROBS, integer=True)
    if top is not None and not wanted:
        fail("sampling", "top_logprobs needs logprobs set to true", "top_logprobs")
    return (top or 0) if wanted else None, None


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
