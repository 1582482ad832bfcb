"""Tokens grouped into the characters they decode to.

A token's label (the trace's token text) is its text, or, where the token holds only part of a
character, its bytes written <0xE4><0xBB> (the engine names the bytes no character can be made
of; a label may mix both: " <0xE7>"). Byte-level BPE (SmolLM2, the embedded model) and byte
fallback (Gemma 3, for a rare character) split a character's UTF-8 bytes over several tokens, and a
token may end one character and start the next (none of the three served vocabularies has such a
piece, 2026-12-06; the grouping allows it). No token of theirs has "<0x" in its own text, so a
label says its bytes without ambiguity. `group` puts the labels' bytes back together,
decodes them, and says which tokens each character spans; `Run`s are the stretches of tokens
that characters tie together (a token on its own is a run of one).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Sequence

from visualizers import i18n

_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def label_bytes(label: str) -> bytes:
    """A label's bytes: each <0xNN> its byte, the rest its UTF-8."""
    out, at = bytearray(), 0
    for m in _BYTE.finditer(label):
        out += label[at:m.start()].encode("utf-8", "surrogatepass")
        out.append(int(m.group(1), 16))
        at = m.end()
    out += label[at:].encode("utf-8", "surrogatepass")
    return bytes(out)


@dataclass(frozen=True)
class Char:
    """One character of the decoded bytes: its text ("" for a byte no character can be made of),
    its bytes [start, end) in the tokens' byte stream, and the tokens [first, last] it spans."""
    text: str
    start: int
    end: int
    first: int
    last: int

    @property
    def valid(self) -> bool:
        return self.text != ""

    @property
    def split(self) -> bool:
        return self.last > self.first


@dataclass(frozen=True)
class Run:
    """Tokens [first, last] tied by split characters (first == last: a token on its own), their
    characters, and where each token's bytes lie in the stream."""
    first: int
    last: int
    chars: tuple[Char, ...]
    spans: tuple[tuple[int, int], ...]  # per token of the run: [start, end) of its bytes
    raws: tuple[bytes, ...]  # per token of the run: its bytes

    @property
    def joined(self) -> bool:
        return self.last > self.first


def _utf8_length(lead: int) -> int:
    return 1 if lead < 0x80 else 2 if 0xC2 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 \
        else 4 if 0xF0 <= lead < 0xF5 else 0


def _decode(stream: bytes) -> list[tuple[str, int, int]]:
    """(character, start, end) for each character of stream; a byte that starts no valid
    character is one entry of its own, with text ""."""
    out, k = [], 0
    while k < len(stream):
        n = _utf8_length(stream[k])
        text = ""
        if n:
            try:
                text = stream[k:k + n].decode("utf-8")
            except UnicodeDecodeError:
                n = 0
        out.append((text, k, k + (n or 1)))
        k += n or 1
    return out


def _segments(special: tuple[bool, ...]) -> list[range]:
    """Stretches of ordinary tokens, and each special token alone (its bytes never join a neighbour's)."""
    out, start = [], 0
    for i, sp in enumerate(special):
        if sp:
            if start < i:
                out.append(range(start, i))
            out.append(range(i, i + 1))
            start = i + 1
    if start < len(special):
        out.append(range(start, len(special)))
    return out


@functools.lru_cache(maxsize=64)
def _group(labels: tuple[str, ...], special: tuple[bool, ...]) -> tuple[tuple[Run, ...], tuple[int, ...]]:
    raws = [label.encode("utf-8", "surrogatepass") if special[i] else label_bytes(label)
            for i, label in enumerate(labels)]
    bounds, at = [], 0
    for raw in raws:
        bounds.append((at, at + len(raw)))
        at += len(raw)
    runs: list[Run] = []
    run_of = [0] * len(labels)
    for seg in _segments(special):
        base = bounds[seg.start][0]
        owner = [i for i in seg for _ in raws[i]]
        chars = [Char(t, base + s, base + e, owner[s], owner[e - 1])
                 for t, s, e in _decode(b"".join(raws[i] for i in seg))]
        i, c = seg.start, 0
        while i < seg.stop:
            last, mine = i, []
            while c < len(chars) and chars[c].first <= last:
                last = max(last, chars[c].last)
                mine.append(chars[c])
                c += 1
            runs.append(Run(i, last, tuple(mine), tuple(bounds[i:last + 1]), tuple(raws[i:last + 1])))
            run_of[i:last + 1] = [len(runs) - 1] * (last + 1 - i)
            i = last + 1
    return tuple(runs), tuple(run_of)


def group(labels: Sequence[str], special: Sequence[bool] = ()) -> tuple[tuple[Run, ...], tuple[int, ...]]:
    """labels: the tokens' labels in order; special: which are special tokens (never joined).
    -> (the runs in order, the index in it of each token's run)."""
    flags = tuple(bool(x) for x in special)[:len(labels)]
    return _group(tuple(labels), flags + (False,) * (len(labels) - len(flags)))


def hex_bytes(raw: bytes) -> str:
    return " ".join(f"{b:02X}" for b in raw)


def part_of(run: Run, token: int) -> list[tuple[Char, bool]]:
    """The characters token (an index of the whole list) touches, each with whether the token
    holds it whole."""
    s, e = run.spans[token - run.first]
    return [(c, s <= c.start and c.end <= e) for c in run.chars if c.start < e and c.end > s and c.end > c.start]


def describe(run: Run, token: int, lang: str = i18n.DEFAULT) -> str:
    """A hover line for a token of a run: its bytes and what of which characters they are
    ("bytes E4 BB: 2 of the 3 bytes of 什")."""
    s, e = run.spans[token - run.first]
    parts = []
    for c, whole in part_of(run, token):
        if not c.valid:
            parts.append(i18n.gettext(lang, "a byte that makes no character"))
        elif not whole:
            mine = min(e, c.end) - max(s, c.start)
            parts.append(i18n.gettext(lang, "{mine} of the {bytes} bytes of {char} ({code})", mine=str(mine),
                                      bytes=str(c.end - c.start), char=c.text, code="U+" + format(ord(c.text), "04X")))
    return i18n.gettext(lang, "; ").join(parts)
