"""The classroom's POST bodies as pydantic models (the schema /openapi.json shows), read
from the raw request: a vote comes as text/plain from a static bundle on another origin
(no CORS preflight), so the routes read the bytes themselves, with a small size limit, and
refuse a body in the words the classroom always used."""
from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from app.api.openai_routes import read_body
from app.classroom.question import CHOICE_RULE, MAX_GUESS_CHARS, VoteRefused
from app.serving.limits import RequestRefused

MAX_SMALL_BODY = 4096  # a vote or a presenter's action
MAX_UPLOAD = 16 * 2**20  # a trace posted to make a room (a long fully traced request is a few MB)
ROOM_SHAPE = "the body must be {\"request_id\": ID} or {\"trace\": <a trace file>}"
GOTO_SHAPE = "the body must be {\"key\": str, \"stage\": int}"
ACTIONS = "action must be \"open\", \"reveal\", \"close\" or \"show\""
NO_VOTER = "no voter id: open the room's page first (it sets one), or send {\"voter\": <8 to 64 characters>}"


class Small(BaseModel):
    model_config = ConfigDict(extra="ignore")  # as the classroom's pages always sent: extras are not read


class NewRoom(Small):
    """POST /classroom: a request this server kept, or a trace file (one of them)."""
    request_id: StrictStr | None = Field(None, description="a request this server kept (its completion id)")
    trace: dict[str, Any] | None = Field(None, description="a trace file (the page's export)")


class Goto(Small):
    """The presenter moves the class to a stage (clamped to the stages)."""
    key: Any = Field(None, description="the presenter's key (from the presenter's link)")
    stage: int


class Ask(Small):
    """The presenter's "predict the next token": open (at an answer position), reveal, close, or show."""
    key: Any = Field(None, description="the presenter's key")
    action: Literal["open", "reveal", "close", "show"]
    position: StrictInt | None = Field(None, description="open: the answer token's position (default the first)")


class Pick(Small):
    """The presenter's pick on every screen: the pass that read a token, a layer and a head."""
    key: Any = Field(None, description="the presenter's key")
    position: StrictInt | None = Field(None, ge=0, description="null: the default pass")
    layer: StrictInt | None = Field(None, ge=0)
    head: StrictInt | None = Field(None, ge=0)


class CodeView(Small):
    """The presenter opens or closes the stages' code view on every screen."""
    key: Any = Field(None, description="the presenter's key")
    open: StrictBool = Field(description="true: every screen shows the stage's code")


class Vote(Small):
    """A student's vote: a candidate's place in the order shown, or a typed guess (one of them)."""
    choice: StrictInt | None = Field(None, description="a candidate's place in the order shown (0: the first)")
    guess: StrictStr | None = Field(None, description=f"1 to {MAX_GUESS_CHARS} characters")
    voter: StrictStr | None = Field(None, description="8 to 64 characters: the voter's id, without the page's cookie")


MESSAGES: dict[type[Small], dict[str, str]] = {
    NewRoom: {"request_id": "request_id must be a string: a request this server kept", "trace": ROOM_SHAPE},
    Goto: {},
    Ask: {"action": ACTIONS, "position": "position must be an int: an answer token's position"},
    Pick: {"position": "position must be a non-negative int or null", "layer": "layer must be a non-negative int",
           "head": "head must be a non-negative int"},
    CodeView: {"open": "open must be true or false"},
    Vote: {"choice": CHOICE_RULE,
           "guess": f"guess must be 1 to {MAX_GUESS_CHARS} characters of text", "voter": NO_VOTER},
}
B = TypeVar("B", bound=Small)


async def json_object(request: Request, limit: int = MAX_SMALL_BODY, invalid: str = "the body must be a JSON object"
                      ) -> dict:
    """The body as a JSON object; VoteRefused (413 past `limit`, else 400 with `invalid`)."""
    try:
        body = json.loads(await read_body(request, limit) or b"null")
    except RequestRefused as e:
        raise VoteRefused(str(e), e.status) from None
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise VoteRefused(invalid) from None
    if not isinstance(body, dict):
        raise VoteRefused(invalid)
    return body


async def read_model(request: Request, model: type[B], limit: int = MAX_SMALL_BODY) -> B:
    """The body as `model`; VoteRefused names the first field that is wrong."""
    shape = GOTO_SHAPE if model is Goto else "the body must be a JSON object"
    body = await json_object(request, limit, shape)
    try:
        return model.model_validate(body)
    except ValidationError as e:
        name = str(e.errors()[0]["loc"][0])
        message = MESSAGES[model].get(name)
        raise VoteRefused(message or shape, param=name if message else None) from None
