"""Which language a browser gets: `?lang=` forces one, else the remembered choice (the
switch's cookie), else the browser's Accept-Language, else English. Tags are matched
loosely: zh, zh-CN, zh-Hans, zh_CN all mean Simplified Chinese; en-GB means English."""
from __future__ import annotations

from visualizers.i18n.catalog import DEFAULT, LANGS

COOKIE = "tt_lang"  # the switch's choice, remembered by the browser (also kept in localStorage)
TAGS = {"en": "en", "zh_CN": "zh-CN"}  # a language -> its BCP 47 tag (for ?lang= and <html lang>)


def normalize(tag: str | None) -> str | None:
    """A language tag -> one of LANGS, or None when it names none of them."""
    t = (tag or "").strip().replace("_", "-").lower()
    if not t:
        return None
    if t.startswith("zh"):  # zh, zh-cn, zh-hans, zh-sg; zh-tw / zh-hant too: the nearest we have
        return "zh_CN"
    base = t.split("-")[0]
    return base if base in LANGS else None


def from_accept(header: str | None) -> str | None:
    """The Accept-Language header's first language we have, by its q weights."""
    ranked = []
    for i, part in enumerate((header or "").split(",")):
        tag, _, params = part.strip().partition(";")
        q = 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                q = 0.0
        if tag and tag != "*" and q > 0:
            ranked.append((-q, i, tag))
    for _, _, tag in sorted(ranked):
        if (lang := normalize(tag)) is not None:
            return lang
    return None


def choose(query: str | None = None, cookie: str | None = None, accept: str | None = None) -> str:
    """?lang=, then the cookie, then Accept-Language, then English."""
    return normalize(query) or normalize(cookie) or from_accept(accept) or DEFAULT
