"""A completion's choices in OpenAI's shapes, whole or as stream chunks, from the service's
output items (one request per choice: the item's request_id says whose)."""
from __future__ import annotations

from dataclasses import dataclass, field

from app.api.logprobs import TokenText, chat_entry, completion_logprobs
from app.serving.requests import Submission

FINISH = {"stop": "stop", "length": "length", "abort": "stop"}


@dataclass
class Choice:
    """What one choice's request has produced so far."""
    index: int
    parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict] = field(default_factory=list)  # one per token, when asked for
    prompt_ids: list[int] | None = None  # with the prompt's logprobs (echo), from the first output
    prompt_logprobs: list[dict | None] | None = None
    reason: str | None = None  # the engine's finish reason, once done
    usage: dict | None = None

    def add(self, item: dict) -> None:
        """An output item of this choice's request."""
        self.parts.append(item["text"])
        if item["token_id"] >= 0:  # an abort's final output has no token
            self.token_ids.append(item["token_id"])
        if "logprobs" in item:
            self.logprobs.append(item["logprobs"])
        if "prompt_logprobs" in item:
            self.prompt_ids, self.prompt_logprobs = item["prompt_token_ids"], item["prompt_logprobs"]

    @property
    def finish(self) -> str | None:
        return None if self.reason is None else FINISH.get(self.reason, self.reason)


def chat_choice(c: Choice, sub: Submission, text: TokenText) -> dict:
    lp = None
    if sub.params.logprobs is not None:
        lp = {"content": [chat_entry(e, text) for e in c.logprobs], "refusal": None}
    return {"index": c.index, "message": {"role": "assistant", "content": "".join(c.parts)}, "logprobs": lp,
            "finish_reason": c.finish}


def echo_text(sub: Submission, text: TokenText) -> str:
    """The prompt as echo returns it: the text sent, or token ids' text (special tokens written out)."""
    return sub.prompt if isinstance(sub.prompt, str) else text.tokenizer.decode(sub.prompt, skip_special_tokens=False)


def completion_choice(c: Choice, sub: Submission, text: TokenText) -> dict:
    """With echo the prompt comes first (and its tokens' logprobs, the first one null);
    score_only (echo, max_tokens 0): the prompt alone."""
    body = "" if sub.score_only else "".join(c.parts)
    ids, entries = ([], []) if sub.score_only else (c.token_ids, c.logprobs)
    if sub.echo:
        body = echo_text(sub, text) + body
        if c.prompt_ids is not None:
            ids, entries = c.prompt_ids + ids, c.prompt_logprobs + entries
    lp = completion_logprobs(entries, ids, text) if sub.params.logprobs is not None else None
    finish = "length" if sub.score_only else c.finish  # max_tokens 0: stopped by its length, whatever was drawn
    return {"index": c.index, "text": body, "logprobs": lp, "finish_reason": finish}


def usage(choices: list[Choice], sub: Submission) -> dict | None:
    """One prompt, n completions: the prompt counted once (as OpenAI counts n choices)."""
    if any(c.usage is None for c in choices):
        return None
    first = choices[0].usage
    completion = 0 if sub.score_only else sum(c.usage["completion_tokens"] for c in choices)
    return {"prompt_tokens": first["prompt_tokens"], "completion_tokens": completion,
            "total_tokens": first["prompt_tokens"] + completion,
            "prompt_tokens_details": {"cached_tokens": first["cached_tokens"]}}


class ChunkWriter:
    """The stream's choice objects, one per output item, with what each choice has sent
    so far (completions' text_offset counts on from there)."""

    def __init__(self, endpoint: str, sub: Submission, text: TokenText) -> None:
        self.endpoint, self.sub, self.text = endpoint, sub, text
        self.offsets: dict[int, int] = {}
        self.prompt: tuple[list[int], list] = ([], [])  # echo: the prompt's ids and logprobs (choice 0 has them)

    def first(self, index: int) -> dict | None:
        """The choice's opening chunk: chat's role; completions' echoed prompt (filled by output())."""
        if self.endpoint == "chat":
            return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                    "finish_reason": None}
        return None

    def output(self, index: int, item: dict) -> list[dict]:
        """The chunks' choices for one output item (none: nothing to send)."""
        sub, lp_wanted = self.sub, self.sub.params.logprobs is not None
        out = []
        if "prompt_logprobs" in item:
            self.prompt = item["prompt_token_ids"], item["prompt_logprobs"]
        if self.endpoint == "completion" and sub.echo and index not in self.offsets:
            ids, entries = self.prompt
            lp = completion_logprobs(entries, ids, self.text) if lp_wanted and ids else None
            echoed = echo_text(sub, self.text)
            out.append({"index": index, "text": echoed, "logprobs": lp, "finish_reason": None})
            self.offsets[index] = lp["text_offset"][-1] + len(lp["tokens"][-1]) if lp else len(echoed)
        if sub.score_only or (not item["text"] and not (lp_wanted and "logprobs" in item)):
            return out
        if self.endpoint == "chat":
            lp = {"content": [chat_entry(item["logprobs"], self.text)], "refusal": None} \
                if lp_wanted and "logprobs" in item else None
            out.append({"index": index, "delta": {"content": item["text"]}, "logprobs": lp, "finish_reason": None})
            return out
        lp = None
        if lp_wanted and "logprobs" in item:
            lp = completion_logprobs([item["logprobs"]], [item["token_id"]], self.text, self.offsets.get(index, 0))
            self.offsets[index] = lp["text_offset"][-1] + len(lp["tokens"][-1])
        out.append({"index": index, "text": item["text"], "logprobs": lp, "finish_reason": None})
        return out

    def done(self, index: int, reason: str) -> dict:
        finish = "length" if self.sub.score_only else FINISH.get(reason, reason)
        if self.endpoint == "chat":
            return {"index": index, "delta": {}, "logprobs": None, "finish_reason": finish}
        return {"index": index, "text": "", "logprobs": None, "finish_reason": finish}
