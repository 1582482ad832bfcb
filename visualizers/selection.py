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

from visualizers import i18n
from visualizers._html import esc, said_html, said_html_n, show_piece
from visualizers.char_runs import label_html


@dataclass(frozen=True)
class Selection:
    read: int | None  # p: the position the pass read (None: no pass has produced a token yet)
    labels: tuple[str, ...]  # token text by position, the newest included
    n_prompt: int = 0  # the prompt's tokens (positions below it were given, not drawn)
    clicked: int | None = None  # what was clicked (None: the default, the newest pass)
    lang: str = i18n.DEFAULT  # the language of its words (the page tab's)
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
        return f"<code>{label_html(self.labels, pos)}</code>" if self.labels[pos] else \
            said_html(self.lang, "(an empty piece)")

    def words(self) -> str:
        """The selected pass in one phrase (HTML): "the pass that read ' Paris' (position 32)
        and predicted '.' (position 33)"."""
        if self.read is None:
            return said_html(self.lang, "no pass has produced a token yet")
        p, values = self.read, {"read": self.token(self.read), "predicted": self.token(self.read + 1)}
        if self.drew:
            return said_html(self.lang, "the pass that read {read} (position {p}) and predicted {predicted} "
                                        "(position {q})", p=str(p), q=str(p + 1), **values)
        return said_html(self.lang, "the pass that read {read} (position {p}) and predicted {predicted} (position "
                                    "{q}, the prompt's own next token: nothing was drawn)", p=str(p), q=str(p + 1),
                         **values)

    def note(self) -> str:
        """Why the selection is not the clicked token's own row, when it is not (HTML; "" else)."""
        if self.clicked_newest:
            return said_html(self.lang, "{token} (position {q}) is the newest token: it was drawn but never read by "
                                        "any pass, so this is the pass that predicted it",
                             token=self.token(self.read + 1), q=str(self.read + 1))
        if self.behind:
            return said_html_n(self.lang, "the newest pass whose logit lens is computed; the {n} newer pass gets "
                                          "its lens after the answer's last token",
                               "the newest pass whose logit lens is computed; the {n} newer passes get "
                               "theirs after the answer's last token", self.behind)
        return ""


def select_pass(labels: Sequence[str], clicked: int | None = None, n_prompt: int = 0,
                lang: str = i18n.DEFAULT) -> Selection:
    """The pass a click on `clicked` picks (None: the newest pass). labels: every known
    token, prompt and generated; before the first token is drawn no pass is complete."""
    labels = tuple(labels)
    n = len(labels)
    newest = n - 2 if n >= 2 and n > n_prompt else None  # the pass that predicted the newest token
    if clicked is None or newest is None or clicked < 0:
        return Selection(newest, labels, n_prompt, None, lang)
    return Selection(min(clicked, newest), labels, n_prompt, clicked, lang)


def newest_with_lens(sel: Selection, newest_lens: int | None) -> Selection:
    """While a request streams at level full its newest token's logit lens is computed every
    0.3 s or so, the rest after its last token (engine/trace/lens_queue.py): with no click the
    panels show the newest pass that HAS its lens (newest_lens: the newest lens event's
    position, the token that pass predicted; None: no lens to wait for), every stage of one pass."""
    if sel.clicked is not None or sel.read is None or newest_lens is None or newest_lens - 1 >= sel.read:
        return sel
    return replace(sel, read=newest_lens - 1, behind=sel.read - (newest_lens - 1))


def header_html(title: str, selection: Selection | None = None, frozen: str = "", extra: str = "",
                lang: str | None = None) -> str:
    """A panel's title line (title: its English, shown in the language: lang, else the
    selection's), the selected pass under it when the panel follows the selection, and the
    frozen-capture warning (frozen_html's) when there is one. extra: safe HTML."""
    lang = lang or (selection.lang if selection is not None else i18n.DEFAULT)
    sel = ""
    if selection is not None and selection.read is not None:
        note, chosen = selection.note(), said_html(lang, "selected: {what}", what=selection.words())
        sel = (f'<div class="tt-sel-pass">{chosen}'
               + (f'<div class="tt-sel-why">{note}</div>' if note else "") + "</div>")
    return f'<div class="tt-title">{esc(i18n.gettext(lang, title))}{extra}</div>{frozen}{sel}'


def frozen_html(truncated: dict | None, last_position: int | None, labels: Sequence[str] = (),
                what: str = "captures", lang: str = i18n.DEFAULT) -> str:
    """The warning of a panel whose captures the trace's byte cap stopped ("" when it was not
    truncated). last_position: the newest position this panel captured (None: none at all);
    what: the captures' name, in English (shown in lang)."""
    if not truncated:
        return ""
    cap = truncated.get("limit_bytes")
    cap_text = said_html(lang, " of {size}", size=esc(f"{cap / 2**20:.3g} MiB")) if cap else ""
    if last_position is None:
        where = said_html(lang, "before any was recorded")
    else:
        # a verify pass also captures draft positions that were rejected: name the answer's last one
        last = min(last_position, len(labels) - 1) if labels else last_position
        # a byte piece of a split character has no text of its own: say so, never an empty <code>
        tok = f" <code>{show_piece(labels[last]) or said_html(lang, '(no text)')}</code>" \
            if 0 <= last < len(labels) else ""
        where = said_html(lang, "after token{token} at position {p}", token=tok, p=str(last))
    step = truncated.get("first_step", truncated.get("step"))  # the first pass missing its captures
    at = said_html(lang, " (engine step {step})", step=esc(step)) if step is not None else ""
    return '<div class="tt-frozen" role="alert">' + said_html(
        lang, "⚠ frozen: its {what} stopped {where}{step}: the trace reached the per-request cap{cap}; later tokens "
              "are not drawn here", what=esc(i18n.gettext(lang, what)), where=where, step=at, cap=cap_text) + "</div>"


def plural(n: int, one: str, many: str | None = None) -> str:
    """"1 KV head", "3 KV heads"."""
    return f"{n:,} {one if n == 1 else (many or one + 's')}"
