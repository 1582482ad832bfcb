"""What a later request will find in the prefix cache after this one, computed, not promised:
the cache keeps full blocks only (engine/block_manager.py hashes each full block of computed
tokens, chained from the first), and a lookup never takes a prompt's last token, so a request
that shares this prompt's first S tokens finds S // block_size blocks (at most
(its length - 1) // block_size).

Where the shared part ends is read from the prompt's own tokens (the `tokenize` event): the
tokens that end before the user's text are the system prompt with its template (what another
question under the same system prompt shares); those that end with it are what a follow-up
sharing the whole question shares. The page's "second request" button sends the request
`next_hit` plans, so the stage sentence and the button say and do the same thing."""
from __future__ import annotations

from dataclasses import dataclass

FOLLOW_UP = " Please keep it short."  # added after the question: the follow-up shares everything before it


@dataclass
class NextHit:
    """The second request that will hit, and what it shares."""
    kind: str  # "follow-up": the same messages, the last one with FOLLOW_UP added; "again": the same prompt
    shared: int  # tokens of this prompt the second request begins with
    blocks: int  # full blocks of them it will find in the cache
    system_tokens: int | None  # the tokens before the user's text (None: not found in the tokens)
    messages: list[dict] | None  # the second request's messages (None: a plain prompt)
    prompt: str | None = None  # ... or its plain prompt


def asked(arrive: dict | None, body: dict | None) -> tuple[list | None, str | None]:
    """A request's chat messages (None: a plain prompt), or its plain prompt."""
    arrive, body = arrive or {}, body or {}
    msgs = arrive.get("messages") or body.get("messages")
    prompt = arrive.get("prompt") if isinstance(arrive.get("prompt"), str) else body.get("prompt")
    return (msgs if isinstance(msgs, list) and msgs else None), (prompt if isinstance(prompt, str) else None)


def _ends(tokens: list[dict]) -> list[int]:
    """The character offset where each token ends in the prompt's text."""
    out, at = [], 0
    for t in tokens:
        at += len(str(t.get("text", "")))
        out.append(at)
    return out


def _before(ends: list[int], offset: int) -> int:
    """Tokens that end at or before `offset`."""
    return sum(1 for e in ends if e <= offset)


def _split(tokenize: dict | None, messages: list | None, prompt: str | None
           ) -> tuple[int | None, int | None, dict | None, str | None]:
    """-> (tokens before the user's text, tokens up to its end, the last message, its text);
    Nones where the text is not found among the tokens."""
    last = messages[-1] if messages and isinstance(messages[-1], dict) else None
    content = last.get("content") if last is not None and last.get("role") == "user" else None
    if messages is None and isinstance(prompt, str):
        content = prompt
    tokens = (tokenize or {}).get("tokens") or []
    text = "".join(str(t.get("text", "")) for t in tokens)
    if not isinstance(content, str) or not content or (start := text.rfind(content)) < 0:
        return None, None, last, content
    ends = _ends(tokens)
    return _before(ends, start), _before(ends, start + len(content)), last, content


def next_hit(tokenize: dict | None, messages: list | None, prompt: str | None, block_size: int) -> NextHit | None:
    """The request to send next so that it hits, or None: this prompt fills no full block
    that a longer prompt could share."""
    if not tokenize or not tokenize.get("tokens"):
        return None
    n = int(tokenize.get("count") or len(tokenize["tokens"]))
    system, shared, last, content = _split(tokenize, messages, prompt)
    if shared is not None and shared // block_size >= 1:
        if messages is not None:
            return NextHit("follow-up", shared, shared // block_size, system,
                           [*messages[:-1], {**last, "content": content + FOLLOW_UP}])
        return NextHit("follow-up", shared, shared // block_size, system, None, content + FOLLOW_UP)
    if (n - 1) // block_size >= 1:  # the same prompt again: every full block but a last one
        return NextHit("again", n, (n - 1) // block_size, system, list(messages) if messages else None,
                       prompt if messages is None else None)
    return None


def system_tokens(tokenize: dict | None, messages: list | None) -> int | None:
    """The tokens before the user's text: the system prompt with its template (None: no
    chat messages, or the text not found among the tokens)."""
    return _split(tokenize, messages, None)[0] if messages else None
