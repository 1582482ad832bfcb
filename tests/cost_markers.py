"""The cost markers (pytest.ini): derived from what a test uses, its own source and that of
every fixture it requests, so that a test written tomorrow is sorted without a mark by hand.
A mark only selects (-m "not browser"); a test marked by a word it merely mentions runs the same."""
from __future__ import annotations

import inspect
import re
from functools import cache

import pytest

# marker -> (fixtures that bring it, words in the test's or its fixtures' source that do)
RULES: dict[str, tuple[frozenset[str], re.Pattern]] = {
    # Chromium through Playwright
    "browser": (frozenset({"browser", "page"}), re.compile(r"\bchromium\(|\bsync_playwright\b|\bbrowser_or_skip\(")),
    # processes beside the test's: prefill engines, tensor-parallel ranks, torchrun, `python -m app`
    "procs": (frozenset(), re.compile(
        r"\bsubprocess\.(run|Popen|check_output|check_call)\b|\bPopen\(|\bprefill_ranks=|\bdecode_ranks="
        r"|\btensor_parallel_size=(?!1\b)|\bexpert_parallel=True|\"--(disaggregate|tensor-parallel-size|"
        r"prefill-ranks|decode-ranks|expert-parallel)\"|\btorchrun\b|\bmultiprocessing\b|\bmp\.(Process|get_context)\b")),
    # a real model from the cache (SmolLM2, Gemma 3)
    "real_model": (frozenset(), re.compile(r"\bcached_gguf\(|\bengine_and_reference\(|\bcached_path\(CATALOG\[")),
}


@cache
def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _sources(item: pytest.Item) -> str:
    """The test function's source and that of every fixture in its closure."""
    parts = [_source(getattr(item, "function", None))]
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        parts += [_source(d.func) for d in defs]
    return "\n".join(parts)


def mark_costs(items: list[pytest.Item]) -> None:
    for item in items:
        text, used = _sources(item), set(getattr(item, "fixturenames", ()))
        for name, (fixtures, words) in RULES.items():
            if used & fixtures or words.search(text):
                item.add_marker(name)


COSTLY = ("browser", "procs", "real_model")


def module_weight(items: list[pytest.Item]) -> int:
    """A module's guessed cost from its marks: a browser, processes or a real model cost
    most, then `slow`; the rest one unit a test."""
    return sum(1 + 10 * bool(i.get_closest_marker("slow")) + 30 * any(i.get_closest_marker(m) for m in COSTLY)
               for i in items)


def costliest_modules_first(items: list[pytest.Item]) -> None:
    """Reorder whole modules (each keeps its own order, and its module-scoped fixtures start
    once): the costliest first, so that with --dist loadfile no worker starts a long module
    while the other has nothing left to run. Stable: equal modules keep collection order."""
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = sorted(by_module.values(), key=module_weight, reverse=True)
    items[:] = [item for module in order for item in module]
