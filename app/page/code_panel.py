"""Each stage's "code that ran it" on the page (docs/page.md): under the stage's sentence a
closed line that opens to the engine's functions for the stage (engine.stage_code(), read
from this checkout; code_view draws them), and in the sentence itself what
this request ran where a stage has several ways, with a few of its values
(code_facts), and the rules that write its values beside the lines that made
them (code_values). The request stage adds the app's intake (intake_code).

The code views depend on the checkout alone: drawn once per process (never on the engine's
thread). The page and the classroom hold only each view's closed line; its functions come
from GET /code/{key} (`add_code_routes`, cached by the browser) when it first opens (code.js,
classroom.js), so a page load does not carry them. Only the short "ran" lines and the values'
rules follow the request. A trace recorded on another checkout says so beside them."""
from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Mapping, Sequence

from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse

from app.page.intake_code import INTAKE_CODE, PATHS as INTAKE_PATHS, intake_way
from engine import checkout_commit, resolve_or_error, stage_code
from visualizers._html import esc
from visualizers.code_facts import ran_html, read
from visualizers.code_values import beside, values_style
from visualizers.code_view import BOX_CSS, stage_code_body, stage_code_html
from visualizers import i18n
from visualizers.i18n import gettext
from visualizers.journey import Stage

CSS = BOX_CSS + ".tt-code-ran { font-size: 13px; margin: 2px 0; } .tt-code-ran b { font-weight: 600; }\n"


@cache
def stages() -> dict[str, list[dict]]:
    """Stage key -> its functions in this checkout: the engine's map, the request stage led by
    the app's intake (once per process)."""
    out = {key: list(entries) for key, entries in stage_code()["stages"].items()}
    intake = [resolve_or_error(code) for code in INTAKE_CODE]
    out["request"] = intake + out.get("request", [])
    return out


@cache
def paths() -> dict[str, str]:
    return {**stage_code()["paths"], **INTAKE_PATHS}


@cache
def code_views(lang: str = "en") -> dict[str, str]:
    """Stage key -> its code view's HTML: closed, its one line (in `lang`); its functions fetched on opening."""
    return {key: stage_code_html(key, entries, paths(), src=code_src(key, lang), lang=lang)
            for key, entries in stages().items()}


def code_src(key: str, lang: str = "en") -> str:
    """Where a view's functions are fetched from: in its reader's language (English: no query)."""
    return f"code/{key}" if lang == i18n.DEFAULT else f"code/{key}?lang={lang}"


@cache
def code_body(key: str, lang: str = "en") -> str:
    """An open view's functions (GET /code/{key}), their words in `lang`; KeyError for a stage that is not one."""
    return stage_code_body(stages()[key], paths(), lang=lang)


def add_code_routes(api: FastAPI) -> None:
    """GET /code/{key}: a stage's code view, opened (the same bytes for every request of this
    checkout: the browser keeps them, revalidating by the commit)."""
    @api.get("/code/{key}", response_class=HTMLResponse, include_in_schema=False)
    def code_view(key: str, lang: str | None = None) -> HTMLResponse:
        if key not in stages():
            raise HTTPException(404, f"no stage {key[:40]!r}")
        tongue = i18n.normalize(lang) or i18n.DEFAULT  # an unknown language: English
        return HTMLResponse(code_body(key, tongue), headers={
            "Cache-Control": "public, max-age=3600", "ETag": f'"{checkout_commit() or "none"}.{key}.{tongue}"'})


@cache
def ways_where() -> dict[str, str]:
    """Each way -> its functions in this checkout as "path:line Name", comma-separated (no word: any language)."""
    out: dict[str, list[str]] = {}
    for entries in stages().values():
        for e in entries:
            if e.get("path") and "file" in e:
                out.setdefault(e["path"], []).append(f"{e['file']}:{e['line']} {e['qualname']}")
    return {way: ", ".join(names) for way, names in out.items()}


def commit_note(model: Mapping, lang: str = "en") -> str:
    """A warning when the trace shown was recorded on another checkout than this one ("" same)."""
    here = checkout_commit()
    there = model.get("commit")
    if there is None:
        return gettext(lang, "This trace does not name its commit; the code shown is this checkout's ({here}).",
                       here=here[:12] or gettext(lang, "unknown"))
    if not here or there.rstrip("+") == here.rstrip("+"):
        return ""
    return gettext(lang, "This trace was recorded on commit {there}; the code shown is this checkout's ({here}).",
                   there=there[:12], here=here[:12])


@cache
def value_names() -> dict[str, tuple[str, ...]]:
    """Stage key -> the names of the values its code view writes beside lines."""
    return {key: tuple(name for e in entries for _, name in e.get("values", ())) for key, entries in stages().items()}


def with_code(shown: Sequence[Stage], model: Mapping, events: Sequence[Mapping], request_id: str,
              position: int | None = None, layer: int | None = None, lang: str = "en") -> list[Stage]:
    """The stages with what this request ran (and the trace's commit, when not this checkout's)
    added to their sentences, and the rules that write its values beside their code's lines
    (position, layer: the pass and the MoE layer the panels show; None: the last; lang: the
    language of the lines' words)."""
    if not request_id:
        return list(shown)
    names, where = paths(), ways_where()
    ran, quoted = read(events, request_id)  # one pass over the events for every stage
    ran = {**ran, "request": {intake_way(request_id): []}}
    said = beside(events, request_id, position, layer)
    note = commit_note(model, lang)
    warn = f"<div class='tt-code-ran tt-code-warn'>⚠ {esc(note)}</div>" if note else ""
    out = []
    for st in shown:
        extra = ""
        if st.reached and not st.skipped:
            extra = ran_html(st.key, events, request_id, names, where, (ran, quoted), lang) + \
                values_style(st.key, value_names().get(st.key, ()), said)
        out.append(replace(st, text=st.text + extra + (warn if st.key == "request" else "")) if extra or warn else st)
    return out
