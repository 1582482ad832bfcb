"""One selection for every panel: the forward pass a click picks.

Clicking the token at position p selects the pass that READ token p and PREDICTED token
p + 1. Every panel then shows that one pass: embedding row p, attention row p (the query
at p), the KV slot p's keys and values were written to, MoE row p, and, for the token it
predicted, the logit lens and the sampling draw (those events are keyed by the position of
the token they produced, p + 1). The newest token was drawn but never read (it would be the
next pass's input), so clicking it shows the pass that predicted it, and says so. With no
click the selection is the newest pass: the one that read the second-newest token and
predicted the newest.

A trace whose byte cap stopped its tensor captures (the `trace.truncated` event) freezes
the panels drawn from them: `frozen_html` is the warning each of those panels puts in its
own header, with the token where its captures stopped."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from visualizers._html import esc, show_piece
from visualizers.char_runs import label_html


@dataclass(frozen=True)
class Selection:
    read: int | None  # p: the position the pass read (None: no pass has produced a token yet)
    labels: tuple[str, ...]  # token text by position, the newest included
    n_prompt: int = 0  # the prompt's tokens (positions below it were given, not drawn)
    clicked: int | None = None  # what was clicked (None: the default, the newest pass)
    behind: int = 0  # newer passes than this default one, whose logit lens is not computed yet (newest_with_lens)

    @property
    def predicted(self) -> int | None:
        return None if self.read is None else self.read + 1

    @property
    def drew(self) -> bool:
        """Did this pass draw its prediction (not a prefill row whose next token the prompt gave)?"""
        return self.read is not None and self.read + 1 >= self.n_prompt

    @property
    def clicked_newest(self) -> bool:
        return self.clicked is not None and self.read is not None and self.clicked > self.read

    def token(self, pos: int | None) -> str:
        """The token at pos as a chip's text (escaped), or its position where unknown."""
        if pos is None:
            return ""
        if not 0 <= pos < len(self.labels):
            return f"#{pos}"
        # a piece of a split character: that character, dashed (char_runs)
        return f"<code>{label_html(self.labels, pos)}</code>" if self.labels[pos] else "(an empty piece)"

    def words(self) -> str:
        """The selected pass in one phrase (HTML): "the pass that read ' Paris' (position 32)
        and predicted '.' (position 33)"."""
        if self.read is None:
            return "no pass has produced a token yet"
        p = self.read
        given = "" if self.drew else ", the prompt's own next token: nothing was drawn"
        return (f"the pass that read {self.token(p)} (position {p}) and predicted {self.token(p + 1)} "
                f"(position {p + 1}{given})")

    def note(self) -> str:
        """Why the selection is not the clicked token's own row, when it is not (HTML; "" else)."""
        if self.clicked_newest:
            return (f"{self.token(self.read + 1)} (position {self.read + 1}) is the newest token: it was drawn "
                    "but never read by any pass, so this is the pass that predicted it")
        if self.behind:
            return (f"the newest pass whose logit lens is computed; the {self.behind} newer "
                    f"pass{'es' if self.behind > 1 else ''} get theirs after the answer's last token")
        return ""


def select_pass(labels: Sequence[str], clicked: int | None = None, n_prompt: int = 0) -> Selection:
    """The pass a click on `clicked` picks (None: the newest pass). labels: every known
    token, prompt and generated; before the first token is drawn no pass is complete."""
    labels = tuple(labels)
    n = len(labels)
    newest = n - 2 if n >= 2 and n > n_prompt else None  # the pass that predicted the newest token
    if clicked is None or newest is None or clicked < 0:
        return Selection(newest, labels, n_prompt, None)
    return Selection(min(clicked, newest), labels, n_prompt, clicked)


def newest_with_lens(sel: Selection, newest_lens: int | None) -> Selection:
    """While a request streams at level full its newest token's logit lens is computed every
    0.3 s or so, the rest after its last token (engine/trace/lens_queue.py): with no click the
    panels show the newest pass that HAS its lens (newest_lens: the newest lens event's
    position, the token that pass predicted; None: no lens to wait for), every stage of one pass."""
    if sel.clicked is not None or sel.read is None or newest_lens is None or newest_lens - 1 >= sel.read:
        return sel
    return replace(sel, read=newest_lens - 1, behind=sel.read - (newest_lens - 1))


def header_html(title: str, selection: Selection | None = None, frozen: str = "", extra: str = "") -> str:
    """A panel's title line, the selected pass under it when the panel follows the selection,
    and the frozen-capture warning (frozen_html's) when there is one. extra: safe HTML."""
    sel = ""
    if selection is not None and selection.read is not None:
        note = selection.note()
        sel = (f'<div class="tt-sel-pass">selected: {selection.words()}'
               + (f'<div class="tt-sel-why">{note}</div>' if note else "") + "</div>")
    return f'<div class="tt-title">{esc(title)}{extra}</div>{frozen}{sel}'


def frozen_html(truncated: dict | None, last_position: int | None, labels: Sequence[str] = (),
                what: str = "captures") -> str:
    """The warning of a panel whose captures the trace's byte cap stopped ("" when it was not
    truncated). last_position: the newest position this panel captured (None: none at all)."""
    if not truncated:
        return ""
    cap = truncated.get("limit_bytes")
    cap_text = f" of {cap / 2**20:.3g} MiB" if cap else ""
    if last_position is None:
        where = "before any was recorded"
    else:
        # a verify pass also captures draft positions that were rejected: name the answer's last one
        last = min(last_position, len(labels) - 1) if labels else last_position
        # a byte piece of a split character has no text of its own: say so, never an empty <code>
        tok = f" <code>{show_piece(labels[last]) or '(no text)'}</code>" if 0 <= last < len(labels) else ""
        where = f"after token{tok} at position {last}"
    step = truncated.get("first_step", truncated.get("step"))  # the first pass missing its captures
    return (f'<div class="tt-frozen" role="alert">⚠ frozen: its {esc(what)} stopped {where}'
            f'{f" (engine step {esc(step)})" if step is not None else ""}: the trace reached the per-request cap'
            f"{esc(cap_text)}; later tokens are not drawn here</div>")


def plural(n: int, one: str, many: str | None = None) -> str:
    """"1 KV head", "3 KV heads"."""
    return f"{n:,} {one if n == 1 else (many or one + 's')}"
