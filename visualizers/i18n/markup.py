"""A panel's sentence as HTML: the catalog's text escaped, then its {names} filled with HTML
the panel made (a token as <code>, a number in bold), so a translation may move them and no
token text reaches the page unescaped. The panels' counterpart of the stages' said()."""
from __future__ import annotations

import html as _html

from visualizers.i18n import gettext, number, translations


def _text(s: str) -> str:
    """HTML text, not an attribute: an apostrophe stays as written (as the stages' said())."""
    return _html.escape(s, quote=False)


def said(lang: str, msgid: str, **html: str) -> str:
    """msgid in `lang`, escaped as HTML text, its {names} filled with the given HTML (already escaped)."""
    return _text(gettext(lang, msgid)).format(**html)


def said_n(lang: str, singular: str, plural: str, n: int, **html: str) -> str:
    """said() in the form the count n takes in `lang` ({n}: n with the language's grouping)."""
    return _text(translations(lang).ngettext(singular, plural, n)).format(n=number(lang, n), **html)


def ms(lang: str, seconds: float) -> str:
    """A duration in milliseconds as the timeline writes every one: '1,234.5 ms' (never '-0.0 ms')."""
    value = seconds * 1000
    return f"{number(lang, 0.0 if round(value, 1) == 0 else value, 1)} ms"
