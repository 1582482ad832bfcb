"""An OpenAI-style chat request body -> what the engine needs, with the checks it passed.
Shared by the page (which shows the body) and the HTTP API."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import get_args

from pydantic import ValidationError

from app.serving.bodies import MODELS, Body, TraceLevel
from app.serving.body_errors import first_problem
from app.serving.fields import constraint, unknown_fields
from engine import SamplingParams

TRACE_LEVELS = get_args(TraceLevel)  # ("full", "basic", "off")


@dataclass
class Submission:
    messages: list[dict]
    params: SamplingParams
    speculative: bool = True
    num_speculative_tokens: int | None = None
    trace_level: str = "full"
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    body: dict | None = None  # as sent (less unknown fields dropped by --ignore-unknown-fields), kept with the trace
    prompt: str | list[int] | None = None  # a plain prompt (completions; base models), text or token ids: no template
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
MIN_TEMPERATURE = 1e-5  # below this, sampling is greedy (as in vLLM): 1/T would overflow the logits


def _or(value, default):
    return default if value is None else value


def parse_body(body: dict, max_tokens_cap: int | None = None, endpoint: str | None = None,
               ignore_unknown: bool = False) -> Submission:
    """Raises BodyError (a ValueError, with the checks so far in .checks) when the body is
    invalid. The body's model (app.serving.bodies) checks each field's type and range, so
    nothing malformed reaches the engine thread; the rules across fields follow here.
    endpoint: "chat" (messages), "completion" (a plain prompt), None: whichever the body has.
    A field the endpoint does not implement is refused, or dropped with ignore_unknown (the
    server's --ignore-unknown-fields)."""
    checks: list[tuple[str, bool, str]] = []

    def fail(name: str, msg: str, param: str | None = None, code: str | None = None):
        checks.append((name, False, msg))
        raise BodyError(msg, param, checks, code)

    if not isinstance(body, dict):
        fail("body", "the body must be a JSON object")
    if endpoint is None:
        endpoint = "completion" if "prompt" in body and "messages" not in body else "chat"
    unknown = unknown_fields(body, endpoint)
    if unknown and ignore_unknown:
        checks.append(("body", True, f"ignored (--ignore-unknown-fields): {', '.join(unknown)}"[:200]))
        # the trace keeps the body the engine read: a replay or the page parses it again without the flag
        body = {k: v for k, v in body.items() if k not in unknown}
    try:
        req = MODELS[endpoint].model_validate(body)
    except ValidationError as e:
        problem = first_problem(e, endpoint)
        fail(problem.check, problem.message, problem.param, problem.code)
    prompt, messages = None, []
    if endpoint == "completion":
        prompt = req.prompt  # text or token ids; OpenAI's batch form holds one of them
        if isinstance(prompt, list) and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, list):  # token ids, as they are (the engine checks them against its vocabulary)
            checks.append(("prompt", True, f"a plain prompt of {len(prompt):,} token ids (no tokenizer, no chat "
                                           "template)"))
        elif not prompt.strip():
            fail("prompt", "the prompt is empty", "prompt")
        else:
            checks.append(("prompt", True, f"a plain prompt of {len(prompt):,} characters (no chat template)"))
    else:
        messages = _messages(req, checks, fail)
    params, n = _sampling(req, endpoint, max_tokens_cap, fail)
    checks.append(("sampling", True, _sampling_check(params, n)))
    spec = req.speculative
    k = spec.num_tokens if spec is not None else None
    enabled = spec.enabled if spec is not None else True
    echo = endpoint == "completion" and bool(req.echo)
    return Submission(messages, params, enabled, k, _or(req.trace_level, "full"), checks, body, prompt, echo,
                      _score_only(req, endpoint))


def _score_only(req: Body, endpoint: str) -> bool:
    """echo with max_tokens 0 scores the prompt alone (evaluation harnesses): one token is drawn, not sent."""
    return endpoint == "completion" and bool(req.echo) and req.max_tokens == 0


def _sampling(req: Body, endpoint: str, max_tokens_cap: int | None, fail) -> tuple[SamplingParams, int]:
    """The sampling fields as SamplingParams, with the rules across fields."""
    length = _length_field(req, endpoint, fail)
    asked = getattr(req, length)
    if asked == 0 and not _score_only(req, endpoint):
        fail("sampling", f"{length} must be at least 1, got {asked!r}", length)
    max_tokens = 1 if _score_only(req, endpoint) else _or(asked, min(64, max_tokens_cap or 64))
    if max_tokens_cap is not None and max_tokens > max_tokens_cap:
        fail("sampling", f"{length} {max_tokens} is above this server's cap of {max_tokens_cap}", length)
    logprobs, prompt_logprobs = _logprobs(req, endpoint, fail)
    structured, problem, message = constraint(req)
    if problem is not None:
        fail("sampling", message, problem)
    temperature = _or(req.temperature, 1.0)
    stop = [req.stop] if isinstance(req.stop, str) else req.stop or []
    penalties = {"presence_penalty": _or(req.presence_penalty, 0.0), "frequency_penalty": _or(req.frequency_penalty,
                 0.0), "repetition_penalty": _or(req.repetition_penalty, 1.0), "min_tokens": _or(req.min_tokens, 0),
                 "logit_bias": {int(t): b for t, b in (req.logit_bias or {}).items()}}
    n = _or(req.n, 1)
    try:
        params = SamplingParams(temperature=0.0 if temperature < MIN_TEMPERATURE else temperature,
                                top_k=_or(req.top_k, 0), top_p=_or(req.top_p, 1.0), min_p=_or(req.min_p, 0.0),
                                max_tokens=max_tokens, seed=req.seed, stop=stop,
                                ignore_eos=bool(req.ignore_eos),  # ignore_eos: vLLM's extra parameter
                                logprobs=logprobs, prompt_logprobs=prompt_logprobs, n=n, structured=structured,
                                **penalties)
    except ValueError as e:  # the remaining rules (top_p > 0): the message names the field
        fail("sampling", str(e), str(e).split(" ")[0])
    return params, n


def _sampling_check(params: SamplingParams, n: int) -> str:
    """What the page says of the sampling fields once they passed."""
    structured = params.structured
    penalties = {name: getattr(params, name) for name in ("presence_penalty", "frequency_penalty",
                                                         "repetition_penalty", "min_tokens", "logit_bias")}
    return (f"temperature {params.temperature:g}, top-k {params.top_k or 'off'}, "
            f"top-p {params.top_p:g}, max {params.max_tokens} tokens, "
            + ("greedy: the argmax, the same every run (no seed needed)" if params.temperature == 0
               else f"seed {params.seed}" if params.seed is not None else "no seed (a random draw)")
            + (f", {n} choices (the prompt prefilled once)" if n > 1 else "")
            + (f", constrained: {structured.kind.replace('_', ' ')}" if structured else "")
            + "".join(f", {name.replace('_', ' ')} {value}" for name, value in penalties.items()
                      if value and (name != "repetition_penalty" or value != 1.0)))


def _length_field(req: Body, endpoint: str, fail) -> str:
    """Which field sets the completion's length: max_completion_tokens (OpenAI's newer name,
    chat) or max_tokens; both only when they agree."""
    new = req.max_completion_tokens if endpoint == "chat" else None
    old = req.max_tokens
    if new is not None and old is not None and new != old:
        fail("sampling", f"max_completion_tokens ({new!r}) and max_tokens ({old!r}) disagree: send one of them"[:200],
             "max_completion_tokens")
    return "max_completion_tokens" if new is not None else "max_tokens"


def _logprobs(req: Body, endpoint: str, fail) -> tuple[int | None, int | None]:
    """(logprobs per new token, logprobs per prompt token) as SamplingParams takes them.
    Chat: logprobs true/false and top_logprobs 0..20 (which needs logprobs true). Completions:
    logprobs an integer 0..20 (the top count), with echo the prompt's tokens' too."""
    if endpoint == "completion":
        return req.logprobs, req.logprobs if req.echo and req.logprobs is not None else None
    if req.top_logprobs is not None and not req.logprobs:
        fail("sampling", "top_logprobs needs logprobs set to true", "top_logprobs")
    return (req.top_logprobs or 0) if req.logprobs else None, None


def _messages(req: Body, checks: list, fail) -> list[dict]:
    clean = [{"role": ROLES[m.role], "content": m.content if isinstance(m.content, str)
              else "".join(p.text for p in m.content)} for m in req.messages]
    if not any(m["content"].strip() for m in clean if m["role"] == "user"):
        fail("messages", "the user message is empty", "messages")
    checks.append(("messages", True, f"{len(clean)} message{'s' if len(clean) != 1 else ''}"))
    return clean
