"""The request bodies this server takes, as pydantic models: OpenAI's names and ranges,
vLLM's extra sampling fields, and this server's own (speculation, the trace level). They
check every field's type strictly (1.5 is not an integer, "5" is not a number, true is not
1) and are the schema /openapi.json shows for each POST body. Rules across fields (the
cap, top_logprobs without logprobs, one constraint at a time) are parse_body's.
No postponed annotations here: some fields' types are built by a call, integer(lo, hi)."""
import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict, StrictBool, StrictStr

from engine import MAX_LOGPROBS

SEED_RANGE = (-(2 ** 63), 2 ** 64 - 1)  # what torch.Generator.manual_seed takes
MAX_CHOICES = 8  # n: choices from one prompt
MAX_LOGIT_BIAS = 300  # token ids one request may bias
MAX_STOPS = 8
LARGE = 2 ** 31  # "at least lo": the bound is only there to keep the number an int32


def _whole(value: Any) -> Any:
    """2.0 is the integer 2 (some clients write every number as a float); 2.5 stays a float."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _utf8(value: str) -> str:
    value.encode("utf-8")  # JSON can carry lone surrogates; the tokenizer cannot (a ValueError)
    return value


def integer(lo: int, hi: int) -> Any:
    """A strict integer in [lo, hi] (the bounds inside, so that the JSON schema shows them)."""
    return Annotated[int, Strict(), Field(ge=lo, le=hi), BeforeValidator(_whole)]


Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Text = Annotated[StrictStr, AfterValidator(_utf8)]
NonEmpty = Annotated[StrictStr, Field(min_length=1)]


class Open(BaseModel):
    """A nested object: its own fields typed, others let through (OpenAI's messages carry
    `name`, its stream options grow)."""
    model_config = ConfigDict(extra="allow")


class TextPart(Open):
    type: Literal["text"]
    text: Text


class Message(Open):
    role: Literal["system", "developer", "user", "assistant"]  # developer: OpenAI's newer name for system
    content: Text | list[TextPart]


class StreamOptions(Open):
    include_usage: StrictBool | None = Field(None, description="a last chunk with the usage of every choice")


class Speculative(Open):
    """This server's own: speculative decoding for this request."""
    enabled: StrictBool = True
    num_tokens: integer(1, 64) | None = Field(None, description="draft tokens per round (k)")


class ResponseText(BaseModel):
    type: Literal["text"]


class ResponseJsonObject(BaseModel):
    type: Literal["json_object"]


class JsonSchemaSpec(Open):
    name: StrictStr = ""
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="a JSON schema the answer follows")
    strict: StrictBool | None = None
    description: StrictStr | None = None


class ResponseJsonSchema(BaseModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


TraceLevel = Literal["full", "basic", "off"]
ResponseFormat = Annotated[ResponseText | ResponseJsonObject | ResponseJsonSchema, Field(discriminator="type")]


def _json_text(value: Any) -> Any:
    """vLLM's guided_json: a schema object, or its JSON text."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value  # refused as "not an object" below
    return value


class Body(BaseModel):
    """The fields both endpoints share, in the order parse_body checked them (the first
    failing field is the one reported)."""
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    model: StrictStr | None = Field(None, description="a served model's name (GET /v1/models); the first if absent")
    user: StrictStr | None = Field(None, description="accepted, unused: who the end user is")
    metadata: dict[Annotated[StrictStr, Field(max_length=64)], Annotated[StrictStr, Field(max_length=512)]] | None \
        = Field(None, max_length=16, description="accepted, unused: tags")
    store: StrictBool | None = Field(None, description="accepted, unused")
    stop: NonEmpty | Annotated[list[NonEmpty], Field(max_length=MAX_STOPS)] | None = Field(
        None, description="strings that end the answer (not sent)")
    ignore_eos: StrictBool | None = Field(None, description="vLLM's: go on past the end-of-sequence token")
    max_tokens: integer(1, LARGE) | None = Field(None, description="tokens to generate (the default 64)")
    temperature: Number | None = Field(1.0, ge=0.0, le=2.0, description="below 1e-5: greedy")
    top_k: integer(-1, LARGE) | None = Field(0, description="vLLM's: the k most likely (0 or -1: off)")
    top_p: Number | None = Field(1.0, ge=0.0, le=1.0)
    min_p: Number | None = Field(0.0, ge=0.0, le=1.0, description="vLLM's")
    seed: integer(SEED_RANGE[0], SEED_RANGE[1]) | None = Field(None)
    n: integer(1, MAX_CHOICES) | None = Field(1, description="choices from one prompt (prefilled once)")
    response_format: ResponseFormat | None = None
    guided_json: Annotated[dict[str, Any], BeforeValidator(_json_text)] | None = Field(
        None, description="vLLM's: a JSON schema (an object, or its JSON text)")
    guided_regex: NonEmpty | None = Field(None, description="vLLM's: a regular expression the answer matches")
    guided_choice: Annotated[list[NonEmpty], Field(min_length=1, max_length=64)] | None = Field(
        None, description="vLLM's: the answer is one of these")
    presence_penalty: Number | None = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: Number | None = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: Number | None = Field(1.0, ge=0.0, le=LARGE, description="vLLM's")
    min_tokens: integer(0, LARGE) | None = Field(0, description="vLLM's: no end before this many")
    logit_bias: dict[Annotated[StrictStr, Field(pattern=r"^[0-9]{1,9}$")],
                     Annotated[Number, Field(ge=-100, le=100)]] | None = Field(
        None, max_length=MAX_LOGIT_BIAS, description="token id (as a string) -> a bias added to its logit")
    speculative: Speculative | None = None
    trace_level: TraceLevel | None = Field(
        None, description="this server's: what the trace keeps (the server's --api-trace-level if absent)")
    stream: StrictBool | None = Field(None, description="server-sent events, one chunk per token")
    stream_options: StreamOptions | None = None


class ChatCompletionRequest(Body):
    """POST /v1/chat/completions"""
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: integer(1, LARGE) | None = Field(None, description="OpenAI's newer max_tokens")
    logprobs: StrictBool | None = Field(None, description="each new token's log-probability")
    top_logprobs: integer(0, MAX_LOGPROBS) | None = Field(None, description="alternatives per token")


TokenIds = Annotated[list[Annotated[int, Strict(), Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(Body):
    """POST /v1/completions: a plain prompt, no chat template (base models): text or token ids,
    alone or as OpenAI's batch of one."""
    prompt: Text | TokenIds | Annotated[list[Text], Field(min_length=1, max_length=1)] \
        | Annotated[list[TokenIds], Field(min_length=1, max_length=1)]
    echo: StrictBool | None = Field(None, description="the prompt comes back before the completion")
    # with echo, max_tokens 0 scores the prompt alone (evaluation harnesses)
    max_tokens: integer(0, LARGE) | None = Field(None, description="tokens to generate (the default 64)")
    logprobs: integer(0, MAX_LOGPROBS) | None = Field(None, description="alternatives per token")


MODELS: dict[str, type[Body]] = {"chat": ChatCompletionRequest, "completion": CompletionRequest}
# the order in which a failing field is reported: the fields as parse_body checked them
ORDER = ("user", "metadata", "store", "prompt", "messages", "stop", "ignore_eos", "echo", "max_completion_tokens",
         "max_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "logprobs", "top_logprobs", "n",
         "response_format", "guided_json", "guided_regex", "guided_choice", "presence_penalty", "frequency_penalty",
         "repetition_penalty", "min_tokens", "logit_bias", "speculative", "trace_level", "stream", "stream_options",
         "model")


def fields_of(endpoint: str) -> frozenset[str]:
    """The fields an endpoint takes, as a client writes them."""
    return frozenset(f.alias or name for name, f in MODELS[endpoint].model_fields.items())
