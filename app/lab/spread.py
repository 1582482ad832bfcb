"""Repeats of a setting → its spread: every numeric metric's median, min, max and the values,
in the order the repeats ran. The repeats are interleaved (repeat 1 of every setting, then
repeat 2, ...), so a busy spell of the machine falls on every setting alike and repeat i of
one setting pairs with repeat i of another."""
from __future__ import annotations

import statistics
from typing import Any

REPEATS = {"ci": 3, "full": 5}  # an experiment may ask for others (Experiment.repeats)


def numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def spread(repeats: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{metric: {median, min, max, n, values}} for every metric numeric in all repeats."""
    out: dict[str, dict[str, Any]] = {}
    for key in repeats[0] if repeats else ():
        values = [r.get(key) for r in repeats]
        if not all(numeric(v) for v in values):
            continue
        ints = all(isinstance(v, int) for v in values)
        mid = statistics.median_low(values) if ints else statistics.median(values)
        out[key] = {"median": mid, "min": min(values), "max": max(values), "n": len(values), "values": values}
    return out


def medians(first: dict[str, Any], spreads: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The first repeat's metrics with every numeric one replaced by its median over the repeats
    (what the tables, bars and sentences quote; lists and flags stay the first repeat's)."""
    return {k: spreads[k]["median"] if k in spreads else v for k, v in first.items()}
