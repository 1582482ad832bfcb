"""The text a person reads, as data: gettext catalogs (Babel) per language, a
gettext / ngettext with named placeholders ("{tokens} tokens"), numbers written for the
language, and which language a browser gets. Lives beside the drawing functions so that
both they (the stages' sentences) and the server can read it.

    gettext("zh_CN", "Send")                                  -> "发送"
    ngettext("zh_CN", "{n} token", "{n} tokens", 5)            -> "5 个词元"

A placeholder is filled with str.format's named fields: numbers are formatted by the
caller (`number`, `percent`, `size`, `seconds`) when they need the language's marks;
`{n}` is the count ngettext was given, written with the language's digit grouping."""
from __future__ import annotations

from visualizers.i18n.catalog import DEFAULT, LANGS, translations
from visualizers.i18n.formats import number, percent, seconds, size
from visualizers.i18n.negotiate import COOKIE, TAGS, choose, from_accept, normalize

__all__ = ["DEFAULT", "LANGS", "COOKIE", "TAGS", "gettext", "ngettext", "N_", "number", "percent", "seconds", "size",
           "choose", "from_accept", "normalize", "sentences"]
GAP = {"zh_CN": ""}  # between two sentences: Chinese puts none after its 。


def N_(msgid: str) -> str:
    """Marks a text for the catalogs where it is written (it is translated where it is shown)."""
    return msgid


def gettext(lang: str, msgid: str, **values) -> str:
    """msgid in `lang` (English where the catalog has no entry), its {names} filled from values."""
    text = translations(lang).gettext(msgid)
    return text.format(**values) if values else text


def sentences(lang: str, *parts: str) -> str:
    """Sentences one after another as the language writes them (English: a space between)."""
    return GAP.get(lang, " ").join(s for s in parts if s)


def ngettext(lang: str, singular: str, plural: str, n: int, **values) -> str:
    """The form of `lang` for the count n (English: one / other; Chinese: one form, with its
    measure word in the text), {n} and the other {names} filled."""
    text = translations(lang).ngettext(singular, plural, n)
    return text.format(n=number(lang, n), **values)
