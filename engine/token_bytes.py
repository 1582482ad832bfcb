"""A token's bytes, and a label that shows the bytes no character can be made of.

Byte-level BPE (GPT-2, SmolLM2, Qwen) and SentencePiece's byte fallback (Llama, Gemma) split a
character outside their merges (an emoji, most Chinese and Arabic) into pieces of its UTF-8
bytes. Decoding such a piece alone gives U+FFFD; the label names its bytes instead: "<0xF0><0x9F>".
"""
from __future__ import annotations

import codecs
import functools
import re

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte, inverted (the table every byte-level BPE uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def piece_bytes(piece: str) -> bytes | None:
    """The bytes a vocabulary piece stands for, or None when they cannot be told from the piece."""
    m = _BYTE_PIECE.fullmatch(piece)
    if m:  # SentencePiece byte fallback
        return bytes([int(m.group(1), 16)])
    table = _byte_decoder()
    if piece and all(ch in table for ch in piece):  # byte-level BPE
        return bytes(table[ch] for ch in piece)
    return None


def _name_bytes(err: UnicodeDecodeError) -> tuple[str, int]:
    return "".join(f"<0x{b:02X}>" for b in err.object[err.start:err.end]), err.end


codecs.register_error("tokentrace_name_bytes", _name_bytes)


def byte_label(text: str, piece: str) -> str:
    """`text` (the token decoded alone), unless it lost bytes to U+FFFD that the piece still
    has: then the piece's bytes, whole characters as text and the rest as <0xNN>."""
    if "\ufffd" not in text:
        return text
    raw = piece_bytes(piece)
    if raw is None:
        return text
    return raw.decode("utf-8", errors="tokentrace_name_bytes")
