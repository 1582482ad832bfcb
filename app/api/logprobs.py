"""Log-probabilities in OpenAI's shapes, from the engine's (engine/logprobs.py, as the
service's output items carry them: {"token_id", "logprob", "rank", "top": [[id, logprob]]}).

chat:        choices[].logprobs = {"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": None}
completions: choices[].logprobs = {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}
A token's text is its decoded text; a token that ends inside a UTF-8 character (byte-level BPE
splits some) has no text of its own, so it reads "bytes:\\xe2\\x80" (vLLM's form), and `bytes`
holds its real bytes either way."""
from __future__ import annotations

import re
from functools import lru_cache

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # sentencepiece's byte fallback


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: each printable stand-in character -> its byte (the
    printable Latin-1 bytes stand for themselves, the other 68 for chr(256 + i) in order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class TokenText:
    """A token's text and UTF-8 bytes as OpenAI's logprobs show them (cached per id)."""

    def __init__(self, tokenizer) -> None:
        """tokenizer: the engine's (engine/tokenizer.py Tokenizer: token_text and .hf)."""
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        got = self._cache.get(token_id)
        if got is None:
            got = self._cache[token_id] = self._text(token_id)
        return got

    def _text(self, token_id: int) -> tuple[str, list[int]]:
        text = self.tokenizer.token_text(token_id)
        if "\ufffd" not in text:
            return text, list(text.encode("utf-8"))
        raw = self._raw_bytes(token_id)
        if raw is None:  # no way back to its bytes: the replacement character, as decoded
            return text, list(text.encode("utf-8"))
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), list(raw)

    def _raw_bytes(self, token_id: int) -> bytes | None:
        piece = self.tokenizer.hf.convert_ids_to_tokens(token_id)
        if not isinstance(piece, str):
            return None
        m = _BYTE_PIECE.fullmatch(piece)
        if m:
            return bytes([int(m.group(1), 16)])
        table = _byte_decoder()
        if all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        return None


def chat_entry(lp: dict, text: TokenText) -> dict:
    """One token of chat's logprobs.content."""
    token, raw = text(lp["token_id"])
    top = []
    for tid, value in lp["top"]:
        t, b = text(tid)
        top.append({"token": t, "logprob": value, "bytes": b})
    return {"token": token, "logprob": lp["logprob"], "bytes": raw, "top_logprobs": top}


def completion_logprobs(entries: list[dict | None], token_ids: list[int], text: TokenText,
                        offset: int = 0) -> dict:
    """Completions' logprobs for these tokens (an entry None: a token with no logprob, the
    prompt's first). text_offset: where each token's text starts in the choice's text,
    counted from `offset` by the tokens' text lengths (as vLLM counts)."""
    tokens, values, tops, offsets = [], [], [], []
    for tid, lp in zip(token_ids, entries):
        token, _ = text(tid)
        tokens.append(token)
        values.append(None if lp is None else lp["logprob"])
        tops.append(None if lp is None else {text(t)[0]: v for t, v in lp["top"]})
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
