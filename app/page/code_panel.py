"""Each stage's "code that ran it" on the page (docs/page.md): under the stage's sentence a
closed line that opens to the engine's functions for the stage (engine.stage_code(), read
from this checkout; code_view draws them), and in the sentence itself what
this request ran where a stage has several ways, with a few of its values
(code_facts).

The code views depend on the checkout alone: drawn once per process, when the page is built
(never on the engine's thread), and never sent again; only the short "ran" lines follow the
request. A trace recorded on another checkout says so beside them."""
from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Mapping, Sequence

from engine import checkout_commit, stage_code
from visualizers._html import esc
from visualizers.code_facts import ran_html, read
from visualizers.code_view import code_css, stage_code_html
from visualizers.journey import Stage

CSS = code_css() + ".tt-code-ran { font-size: 13px; margin: 2px 0; } .tt-code-ran b { font-weight: 600; }\n"


@cache
def code_views() -> dict[str, str]:
    """Stage key -> its code view's HTML, closed (once per process)."""
    code = stage_code()
    return {key: stage_code_html(key, entries, code["paths"]) for key, entries in code["stages"].items()}


@cache
def ways_where() -> dict[str, str]:
    """Each way -> its functions in this checkout as "path:line Name" (and the next)."""
    out: dict[str, list[str]] = {}
    for entries in stage_code()["stages"].values():
        for e in entries:
            if e.get("path") and "file" in e:
                out.setdefault(e["path"], []).append(f"{e['file']}:{e['line']} {e['qualname']}")
    return {way: " and ".join(names) for way, names in out.items()}


def commit_note(model: Mapping) -> str:
    """A warning when the trace shown was recorded on another checkout than this one ("" same)."""
    here = checkout_commit()
    there = model.get("commit")
    if there is None:
        return f"This trace does not name its commit; the code shown is this checkout's ({here[:12] or 'unknown'})."
    if not here or there.rstrip("+") == here.rstrip("+"):
        return ""
    return f"This trace was recorded on commit {there[:12]}; the code shown is this checkout's ({here[:12]})."


def with_code(stages: Sequence[Stage], model: Mapping, events: Sequence[Mapping], request_id: str) -> list[Stage]:
    """The stages with what this request ran (and the trace's commit, when not this checkout's)
    added to their sentences."""
    if not request_id:
        return list(stages)
    names, where = stage_code()["paths"], ways_where()
    known = read(events, request_id)  # one pass over the events for every stage
    note = commit_note(model)
    warn = f"<div class='tt-code-ran tt-code-warn'>⚠ {esc(note)}</div>" if note else ""
    out = []
    for st in stages:
        extra = ran_html(st.key, events, request_id, names, where, known) if st.reached and not st.skipped else ""
        out.append(replace(st, text=st.text + extra + (warn if st.key == "request" else "")) if extra or warn else st)
    return out
