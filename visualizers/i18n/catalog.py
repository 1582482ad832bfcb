"""The message catalogs, read once per process: each language's `messages.po` (the text, as
translators edit it) compiled in memory with Babel (read_po, then write_mo into bytes) and
opened as a `gettext.GNUTranslations`, which applies the catalog's own plural rule. No .mo
file is kept in the repository: the .po is the one copy, so a fixed translation needs no
build step. Fuzzy or empty entries fall back to the English text."""
from __future__ import annotations

import gettext as _gettext
import io
from functools import cache
from pathlib import Path

from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po

LOCALES = Path(__file__).with_name("locales")
LANGS = ("en", "zh_CN")  # the catalog folders; a language is one of these
DEFAULT = "en"


def po_path(lang: str) -> Path:
    return LOCALES / lang / "LC_MESSAGES" / "messages.po"


@cache
def read(lang: str):
    """The parsed catalog (babel.messages.catalog.Catalog) of one language."""
    with po_path(lang).open("rb") as f:
        return read_po(f, locale=lang)


@cache
def translations(lang: str) -> _gettext.NullTranslations:
    """One language's compiled catalog; an unknown language: none (English as written)."""
    if lang not in LANGS:
        return _gettext.NullTranslations()
    buf = io.BytesIO()
    write_mo(buf, read(lang), use_fuzzy=False)
    buf.seek(0)
    return _gettext.GNUTranslations(buf)
