"""Tokens drawn as the characters they make (token_chars groups them): a character split over
byte pieces is one box spanning its pieces, each piece a chip with its id and its bytes on
hover; a piece that ends one character and starts the next sits under both boxes. The same
grouping labels one position (attention axes, the logit lens, the answer's chips)."""
from __future__ import annotations

from typing import Sequence

from visualizers import i18n
from visualizers._html import esc, said_html, said_html_n, show_piece
from visualizers.token_chars import Char, Run, describe, group, hex_bytes, part_of

CJK = ((0x2E80, 0x9FFF), (0xF900, 0xFAFF), (0xFF00, 0xFFEF), (0x20000, 0x3FFFF))  # Han, CJK marks, full-width


def is_cjk(ch: str) -> bool:
    return len(ch) == 1 and ord(ch) >= 0x2E80 and any(lo <= ord(ch) <= hi for lo, hi in CJK)


def _char_box(c: Char, run: Run, lang: str = i18n.DEFAULT) -> str:
    col = f"grid-column:{c.start - run.spans[0][0] + 1}/{c.end - run.spans[0][0] + 1}"
    if not c.valid:
        raw = b"".join(run.raws)[c.start - run.spans[0][0]:c.end - run.spans[0][0]]
        bad = i18n.gettext(lang, "byte {bytes}: no character starts or ends here (not valid UTF-8)",
                           bytes=hex_bytes(raw))
        return f'<span class="tt-char tt-char-bad" style="{col}" title="{esc(bad)}">?</span>'
    n = c.last - c.first + 1
    values = {"char": c.text, "code": f"U+{ord(c.text):04X}", "bytes": str(c.end - c.start), "tokens": str(n)}
    title = (i18n.gettext(lang, "{char} {code}: {bytes} bytes over {tokens} tokens", **values) if n > 1 else
             i18n.gettext(lang, "{char} {code}: {bytes} bytes", **values))
    return f'<span class="tt-char" style="{col}" title="{esc(title)}">{show_piece(c.text)}</span>'


def piece_text(run: Run, token: int) -> str:
    """A piece's chip text inside a run (HTML): the characters it holds whole, the bytes of
    those it holds part of, in hex."""
    s, e = run.spans[token - run.first]
    raw = run.raws[token - run.first]
    out = []
    for c, whole in part_of(run, token):
        if whole and c.valid:
            out.append(show_piece(c.text))
        else:
            out.append(f'<span class="tt-hex">{hex_bytes(raw[max(s, c.start) - s:min(e, c.end) - s])}</span>')
    return "".join(out)


def run_html(run: Run, chips: Sequence[str], lang: str = i18n.DEFAULT) -> str:
    """A run of tokens tied by split characters: the characters' boxes on top, the tokens' chips
    (chips: their HTML, in order) under them, each as wide as its bytes."""
    n = run.spans[-1][1] - run.spans[0][0]
    boxes = "".join(_char_box(c, run, lang) for c in run.chars)
    cells = "".join(
        chip.replace(' class="', f' style="grid-column:{s - run.spans[0][0] + 1}/{e - run.spans[0][0] + 1}" class="', 1)
        for chip, (s, e) in zip(chips, run.spans))
    return f'<span class="tt-run" style="grid-template-columns:repeat({n},auto)">{boxes}{cells}</span>'


def label_html(labels: Sequence[str], pos: int, limit: int | None = None, special: Sequence[bool] = ()) -> str:
    """Position pos's label in context: the characters it holds whole as text, each character it
    holds part of drawn dashed (that character, whose other bytes are in its neighbours), a byte
    that makes no character as its hex. limit: at most that many characters, then "…"."""
    runs, run_of = group(labels, special)
    run = runs[run_of[pos]]
    parts = part_of(run, pos)
    if all(whole and c.valid for c, whole in parts):
        text = labels[pos]
        return show_piece(text if limit is None or len(text) <= limit else text[:limit - 1] + "…")
    out = []
    for c, whole in parts[:limit]:
        if not c.valid:
            out.append(f'<span class="tt-part tt-part-bad">{hex_bytes(_bytes_of(run, c))}</span>')
        else:
            out.append(show_piece(c.text) if whole else f'<span class="tt-part">{show_piece(c.text)}</span>')
    return "".join(out) + ("…" if limit is not None and len(parts) > limit else "")


def _bytes_of(run: Run, c: Char) -> bytes:
    return b"".join(run.raws)[c.start - run.spans[0][0]:c.end - run.spans[0][0]]


def label_title(labels: Sequence[str], pos: int, special: Sequence[bool] = (), lang: str = i18n.DEFAULT) -> str:
    """A hover line for position pos: "" for a token of whole characters, else its bytes and what
    of which characters they are."""
    if "<0x" not in labels[pos]:
        return ""
    runs, run_of = group(labels, special)
    run = runs[run_of[pos]]
    what = describe(run, pos, lang)
    return i18n.gettext(lang, "bytes {bytes}: {what}", bytes=hex_bytes(run.raws[pos - run.first]), what=what) \
        if what else ""


def lone_html(label: str) -> str:
    """A token shown out of context (a logit-lens candidate): a piece of a character as its bytes
    in hex, dashed; anything else as its text."""
    if "<0x" not in label:
        return show_piece(label)
    return label_html([label], 0)


def lone_title(label: str) -> str:
    """What a piece shown out of context is: "bytes E4 BB: the first 2 bytes of a 3-byte character"."""
    if "<0x" not in label:
        return ""
    runs, _ = group([label])
    raw = runs[0].raws[0]
    lead = next((b for b in raw if b >= 0xC0), None)
    if lead is not None:
        need = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        return f"bytes {hex_bytes(raw)}: the start of a {need}-byte character, finished by the next token"
    return f"bytes {hex_bytes(raw)}: the end of a character begun by the token before"


def cjk_note(labels: Sequence[str], special: Sequence[bool], lang: str = i18n.DEFAULT) -> str:
    """One line on how this tokenizer cut the prompt's Chinese: characters, the tokens that hold
    them, how many were split into byte pieces (HTML; "" without Chinese)."""
    if all(label.isascii() and "<0x" not in label for label in labels):
        return ""
    runs, _ = group(labels, special)
    han = [c for r in runs for c in r.chars if c.valid and is_cjk(c.text)]
    if not han:
        return ""
    tokens = sorted({t for c in han for t in range(c.first, c.last + 1)})
    split = sum(1 for c in han if c.split)
    words = [t for t in tokens if is_word(labels[t])]
    shown = "".join(f' <span class="tt-chip tt-word">{show_piece(labels[t])}</span>' for t in words[:4]) \
        + (" …" if len(words) > 4 else "")
    values = {"chars": said_html_n(lang, "{n} character", "{n} characters", len(han), bold=True),
              "tokens": said_html_n(lang, "{n} token", "{n} tokens", len(tokens), bold=True),
              "per": f"<b>{esc(i18n.number(lang, len(han) / len(tokens), 1))}</b>", "split": str(split),
              "words": said_html_n(lang, "{n} token", "{n} tokens", len(words))}
    line = said_html(lang, "Chinese: {chars} in {tokens} ({per} characters a token on this model): {split} split into "
                           "byte pieces, {words} of several whole characters", **values)
    colon = i18n.gettext(lang, ": ").strip()  # Chinese: its full-width colon
    return f"<div class='tt-cjk-note'>{line}{colon + shown if words else ''}</div>"


def is_word(label: str) -> bool:
    """Whether a token of whole characters holds several Chinese ones (a word of Gemma 3's vocabulary)."""
    return not label.isascii() and "<0x" not in label and sum(1 for ch in label if is_cjk(ch)) > 1
