"""Send's controls as the page holds them (`Controls`), and the body fields they make: the seed,
the extra knobs (penalties, min_p / min_tokens, logit bias, JSON mode, n) and the schema box."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from app.serving.requests import BodyError

# the penalties, min_p / min_tokens, the logit bias, JSON mode and n (issue 26: what a learner would try)
MORE = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens", "bias_token", "bias",
        "json_mode", "schema", "n")
LOCKED = ("system", "user", "temperature", "top_k", "top_p", "max_tokens", "seed", "speculative", "k", "level") + MORE
JSON_MODES = ("off", "JSON object", "JSON schema")
SCHEMA = '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}'
MAX_PAGE_CHOICES = 4  # n on the page: side by side, up to 4


@dataclass
class Controls:
    """Send's controls by name, as the page holds them (values as Gradio gives them)."""
    system: str = "You are a helpful assistant."
    user: str = "Tell me a short story about a fox."
    # greedy: the same prompt gets the same answer on every model, the one the docs promise (the
    # sampling panel still shows the distribution and the pick); raise it to watch a draw vary
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 0.95
    max_tokens: int = 48
    seed: str = ""
    speculative: bool = True
    k: int = 1
    level: str = "full"
    model: str | None = None  # the picker: which served model Send goes to
    layer: int = 0
    head: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    bias_token: str = ""  # a token id (a click on a sampling candidate fills it); empty: no logit bias
    bias: float = 0.0
    json_mode: str = "off"  # one of JSON_MODES
    schema: str = SCHEMA  # JSON mode "JSON schema": the schema, as JSON text
    n: int = 1

    @classmethod
    def of(cls, values: dict) -> "Controls":
        """From {name: value}; names not given keep their defaults, unknown names are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{n: v for n, v in values.items() if n in names})

    def as_dict(self) -> dict:
        return asdict(self)


NAMES = tuple(f.name for f in fields(Controls))


def parse_seed(value) -> int | None:
    """The seed box: empty for a random draw, else an integer (BodyError otherwise)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise BodyError("the seed must be an integer (or empty for a random draw)", "seed",
                        [("sampling", False, "seed is not an integer")])
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return int(str(value).strip())
    except ValueError:
        raise BodyError(f"the seed must be an integer (or empty for a random draw), got {str(value)[:40]!r}",
                        "seed", [("sampling", False, "seed is not an integer")]) from None


def more_fields(c: Controls) -> dict:
    """The body fields of the extra controls that are on (a knob at its neutral value sends
    nothing, as a client would not). A token id or schema that is not valid stays as typed:
    parse_body refuses it, and the page says why under the controls."""
    out: dict = {}
    for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0),
                          ("min_p", 0.0)):
        value = float(getattr(c, name) if getattr(c, name) is not None else neutral)
        if value != neutral:
            out[name] = value
    if int(c.min_tokens or 0):
        out["min_tokens"] = int(c.min_tokens)
    token = str(c.bias_token or "").strip()
    if token and float(c.bias or 0):
        out["logit_bias"] = {token: float(c.bias)}
    if c.json_mode == "JSON object":
        out["response_format"] = {"type": "json_object"}
    elif c.json_mode == "JSON schema":
        try:
            schema = json.loads(c.schema or "")
        except ValueError:
            schema = c.schema  # refused by parse_schema before Send
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    if int(c.n or 1) > 1:
        out["n"] = int(c.n)
    return out


def parse_schema(c: Controls) -> None:
    """JSON mode's schema box: a JSON object (BodyError otherwise, said under the box)."""
    if c.json_mode != "JSON schema":
        return
    try:
        schema = json.loads(c.schema or "")
    except ValueError as e:
        raise BodyError(f"the JSON schema is not valid JSON: {e}", "response_format",
                        [("sampling", False, "the schema is not JSON")]) from None
    if not isinstance(schema, dict):
        raise BodyError("the JSON schema must be a JSON object, e.g. " + SCHEMA, "response_format",
                        [("sampling", False, "the schema is not an object")])
