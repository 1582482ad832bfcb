"""The code map's names found in the running checkout: each function's file, its lines
and their text, read with `inspect` from the module Python imported (never a copy), and the
lines its marks name. `stage_code()` is what the page and the classroom read: plain dicts,
computed once per process (they depend on the checkout alone). `checkout_commit()` names
the checkout, so a trace recorded on another one can say so."""
from __future__ import annotations

import importlib
import inspect
import subprocess
from functools import cache
from pathlib import Path

from engine.code_map import PATHS, STAGE_CODE, Code

ROOT = Path(__file__).resolve().parent.parent  # the checkout: paths are shown relative to it
LONG = 60  # a function longer than this shows the lines around its marks, not the whole
AROUND = 6  # lines kept on each side of a mark in a long function
HEAD = 3  # a long function's first lines (its signature) always shown


class CodeMapError(LookupError):
    """A name in the code map that this checkout does not hold as the map says."""


def find(name: str):
    """`module:Qual.name` -> the function (a property's getter, a wrapper's inner function)."""
    module, _, qual = name.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in qual.split("."):
            obj = inspect.getattr_static(obj, part) if inspect.isclass(obj) else getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise CodeMapError(f"{name}: not in this checkout ({e})") from None
    obj = obj.fget if isinstance(obj, property) else getattr(obj, "__func__", obj)  # static/class methods
    obj = inspect.unwrap(obj)
    if not inspect.isfunction(obj) and inspect.isfunction(getattr(obj, "fn", None)):
        obj = obj.fn  # a Triton kernel (triton.jit's JITFunction): the Python function it compiles
    if not inspect.isfunction(obj):
        raise CodeMapError(f"{name}: {type(obj).__name__}, not a function")
    return obj


def _marked(name: str, lines: list[str], first: int, marks: tuple[str, ...]) -> list[int]:
    """The line numbers holding each mark's text: exactly one line of the function each."""
    out = []
    for mark in marks:
        at = [first + i for i, line in enumerate(lines) if mark in line]
        if len(at) != 1:
            raise CodeMapError(f"{name}: mark {mark!r} is on {len(at)} lines of the function, not one")
        out.append(at[0])
    return out


def _shown(first: int, last: int, marks: list[int]) -> list[list[int]]:
    """The line ranges to show, [start, end] inclusive: all of a short function; a long one's
    signature and the lines around its marks (its first LONG lines where it has no mark)."""
    if last - first + 1 <= LONG:
        return [[first, last]]
    if not marks:
        return [[first, first + LONG - 1]]
    spans = sorted([[first, first + HEAD - 1]] + [[max(first, m - AROUND), min(last, m + AROUND)] for m in marks])
    merged = [spans[0]]
    for a, b in spans[1:]:
        if a <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def resolve(code: Code) -> dict:
    """One map entry in this checkout: {"name", "why", "path", "file", "line", "end", "marks",
    "values", "shown", "source"}; source: the function's lines, the first at `line`; values:
    [line, the value's name] for each line the request's value sits beside."""
    fn = find(code.name)
    try:
        lines, first = inspect.getsourcelines(fn)
        file = Path(inspect.getsourcefile(fn) or "").resolve()
    except (OSError, TypeError) as e:
        raise CodeMapError(f"{code.name}: no source ({e})") from None
    last = first + len(lines) - 1
    marks = _marked(code.name, lines, first, code.marks)
    values = [[at, name] for at, (_, name) in zip(_marked(code.name, lines, first, tuple(t for t, _ in code.values)),
                                                   code.values)]
    rel = file.relative_to(ROOT).as_posix() if file.is_relative_to(ROOT) else file.as_posix()
    return {"name": code.name, "qualname": code.name.partition(":")[2], "why": code.why, "path": code.path,
            "file": rel, "line": first, "end": last, "marks": marks, "values": values,
            "shown": _shown(first, last, sorted(set(marks) | {at for at, _ in values})),
            "source": [line.rstrip("\n") for line in lines]}


@cache

def resolve_or_error(code: Code) -> dict:
    """resolve(code), or its entry saying why it cannot be found (the page shows that line)."""
    try:
        return resolve(code)
    except CodeMapError as e:
        return {"name": code.name, "why": code.why, "path": code.path, "error": str(e)}

def stage_code() -> dict:
    """{"stages": {stage key: [resolve(entry) or {"name", "why", "error"}]}, "paths": PATHS,
    "commit": checkout_commit()}: the whole map in this checkout, once per process. A name the
    checkout lacks is an entry with its error (the page says so; the map's test fails on it)."""
    stages = {}
    for key, codes in STAGE_CODE.items():
        entries = []
        for code in codes:
            entries.append(resolve_or_error(code))
        stages[key] = entries
    return {"stages": stages, "paths": dict(PATHS), "commit": checkout_commit()}


@cache
def checkout_commit() -> str:
    """The commit this checkout is at ("" outside a git checkout), with "+" when files differ from it."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("+" if head and dirty else "")
