"""Numbers, percents, sizes and times written the way a language writes them (babel.numbers):
digit grouping, the decimal mark, the percent sign's place, the unit's spacing."""
from __future__ import annotations

from functools import cache

from babel import Locale
from babel.numbers import NumberPattern, format_percent, parse_pattern

from visualizers.i18n.catalog import DEFAULT, LANGS


def _locale(lang: str) -> str:
    return lang if lang in LANGS else DEFAULT


@cache
def _number_format(lang: str, digits: int) -> tuple[NumberPattern, Locale]:
    """babel.numbers.format_decimal's pattern and locale, parsed once (a panel writes hundreds
    of numbers a redraw: parsed each time they cost ~0.2 ms apiece)."""
    return parse_pattern("#,##0" + ("." + "0" * digits if digits else "")), Locale.parse(_locale(lang))


def number(lang: str, x: float, digits: int = 0) -> str:
    """1234567 -> '1,234,567'; digits: the fixed decimals shown (format_decimal's output)."""
    pattern, locale = _number_format(lang, digits)
    return pattern.apply(x, locale, numbering_system="latn")


def percent(lang: str, share: float, digits: int = 0) -> str:
    """0.125 -> '12%' (en) / '12%' (zh_CN); digits: decimals."""
    fmt = "#,##0" + ("." + "0" * digits if digits else "") + "%"
    return format_percent(share, format=fmt, locale=_locale(lang))


def size(lang: str, n: float) -> str:
    """Bytes in binary units, one decimal above a KiB: '262.1 MiB'."""
    for unit, step in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= step:
            return f"{number(lang, n / step, 1)} {unit}"
    return f"{number(lang, int(n))} B"


def seconds(lang: str, s: float) -> str:
    """A duration: milliseconds below a second ('12.5 ms'), seconds above ('1.25 s')."""
    if s < 1:
        return f"{number(lang, s * 1000, 1)} ms"
    return f"{number(lang, s, 2)} s"
