"""The classroom's words in one screen's language: the {{English}} marks of its .html
templates replaced by the catalog's text (escaped), and the script's texts (tr / trn in
classroom.js) sent to it as CONFIG.text. Each screen gets its own browser's language; the
room's state (the presenter's moves) carries no words, so it reaches every screen alike."""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from app.classroom.question import ALL_VOTES, GUESS_RULE, MAX_GUESS_CHARS, NO_QUESTION, OPEN_FIRST, VOTING_CLOSED
from visualizers import i18n
from visualizers._html import esc
from visualizers.i18n.catalog import translations
from visualizers.i18n.extract import JS_CALL

MARK = re.compile(r"\{\{(.+?)\}\}")


def fill(template: str, lang: str) -> str:
    """Each {{English}} of a template in `lang`, escaped for HTML."""
    return MARK.sub(lambda m: esc(i18n.gettext(lang, m.group(1))), template)


@cache
def _script_messages() -> tuple[tuple[str, str | None], ...]:
    """(singular, plural or None) of every tr / trn in classroom.js."""
    text = (Path(__file__).with_name("classroom.js")).read_text(encoding="utf-8")
    return tuple((m.group(2), None) if m.group(2) else (m.group(4), m.group(6)) for m in JS_CALL.finditer(text))


def script_text(lang: str) -> dict:
    """{English: text} for tr, {English singular: [forms]} for trn (one form: Chinese); and the
    API's refusals a screen shows (a vote refused, a question not opened), which it looks up
    by their English (classroom.js: tr(error.message))."""
    cat, out = translations(lang), {}
    if lang == i18n.DEFAULT:
        return out  # the script's own English
    for said in (VOTING_CLOSED, NO_QUESTION, ALL_VOTES, OPEN_FIRST):
        out[said] = cat.gettext(said)
    out[GUESS_RULE.format(n=MAX_GUESS_CHARS)] = cat.gettext(GUESS_RULE).format(n=MAX_GUESS_CHARS)
    nplurals = getattr(cat, "plural", None) and len({cat.plural(n) for n in range(0, 200)})
    for one, other in _script_messages():
        if other is None:
            out[one] = cat.gettext(one)
        else:
            out[one] = [cat.ngettext(one, other, n) for n in ((1, 2) if nplurals and nplurals > 1 else (1,))]
    return out


def switch_html(lang: str) -> str:
    """English / 中文: this screen's language (classroom.js sets the cookie and reloads)."""
    buttons = "".join(f"<button data-lang='{i18n.TAGS[code]}' class='{'tt-on' if code == lang else ''}'>"
                      f"{word}</button>" for code, word in (("en", "English"), ("zh_CN", "中文")))
    return f"<span class='tt-class-lang'>{buttons}</span>"
