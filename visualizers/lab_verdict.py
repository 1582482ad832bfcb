"""Verdicts from the spread of repeats (a setting dict's "spread": {metric: {median, min, max, n,
values}}, app/lab/spread.py): whether one setting's timed metric differs from another's by more
than the noise of this machine, said in a sentence. The rule: the two settings' ranges over
their repeats do not overlap (every repeat of one beat every repeat of the other); otherwise
the difference is within the spread and no conclusion is drawn. Counts (steps, tokens) are
exact and quoted as they are; a count that moved between repeats gets its range."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from visualizers import i18n
from visualizers.i18n import gettext
from visualizers.lab_words import word


@dataclass
class Comparison:
    n: int  # repeats both settings ran
    ratio: float | None  # the median of the paired ratios a_i / b_i (repeat i of each ran side by side)
    low: float | None  # the paired ratios' min and max
    high: float | None
    decided: bool  # the ranges do not overlap

    @property
    def within_spread(self) -> bool:
        return not self.decided


def values(setting: dict, key: str) -> list[float]:
    sp = setting.get("spread", {}).get(key)
    if sp:
        return [v for v in sp["values"] if v is not None]
    v = setting["metrics"].get(key)
    return [] if v is None else [v]


def compare(a: dict, b: dict, key: str) -> Comparison:
    """Setting a's metric against setting b's, repeat by repeat."""
    va, vb = values(a, key), values(b, key)
    n = min(len(va), len(vb))
    ratios = [x / y for x, y in zip(va, vb) if y]
    if not ratios:
        return Comparison(n, None, None, None, False)
    apart = n >= 2 and (max(va) < min(vb) or max(vb) < min(va))
    return Comparison(n, statistics.median(ratios), min(ratios), max(ratios), apart)


def share(a: dict, b: dict, key: str, claim: str, what: str, show: Callable[[float], str],
          lang: str = i18n.DEFAULT, **values: object) -> str:
    """claim: with {pct}, e.g. "continuous finished in {pct} of static's time" (marked N_ where it
    is written, translated here into `lang`, as is `what`). Decided: the claim and the paired
    ratios' range; else: "the difference in WHAT is within the spread of n repeats" with both
    settings' ranges (show formats one value); values: the claim's other {names}."""
    c = compare(a, b, key)
    if c.ratio is None:
        return gettext(lang, "no {what} to compare", what=gettext(lang, what))
    said = gettext(lang, claim, pct=f"{c.ratio:.0%}", **values)
    if c.n < 2:
        return said + gettext(lang, " (one run: no spread to judge it by)")
    if c.decided:
        return said + gettext(lang, " (range {low}–{high} over {n} repeats)", low=f"{c.low:.0%}",
                              high=f"{c.high:.0%}", n=c.n)
    return gettext(lang, "the difference in {what} is within the spread of {n} repeats ({a} {a_span}, {b} {b_span}): "
                         "no conclusion at this size", what=gettext(lang, what), n=c.n, a=word(lang, label(a)),
                   a_span=span(a, key, show), b=word(lang, label(b)), b_span=span(b, key, show))


def span(setting: dict, key: str, show: Callable[[float], str]) -> str:
    """'0.38 s' for one value, '0.31 s–0.72 s' for a range (show formats one value with its unit)."""
    v = values(setting, key)
    if not v:
        return "–"
    lo, hi = min(v), max(v)
    return show(lo) if lo == hi else f"{show(lo)}–{show(hi)}"


def count(setting: dict, key: str, lang: str = i18n.DEFAULT) -> str:
    """An exact count as it is ('52'), or its range where the repeats differed ('50–54')."""
    v = values(setting, key)
    if not v:
        return "–"
    lo, hi = min(v), max(v)
    return f"{lo:,}" if lo == hi else i18n.gettext(lang, "{low}–{high} (over {n} repeats)", low=f"{lo:,}",
                                                   high=f"{hi:,}", n=len(v))


def label(setting: dict) -> str:
    return setting["setting"]["label"]


def seconds(v: float) -> str:
    return f"{v:.2f} s" if v >= 0.1 else f"{v * 1000:.0f} ms" if v >= 0.01 else f"{v * 1000:.1f} ms"
