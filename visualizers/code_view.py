"""The code that ran a stage, as HTML: each function engine/code_map.py names for the stage,
highlighted by Pygments with its line numbers, its marked lines (those that make the stage's
number) lit, and for a long function only the parts that matter, with the lines left out
counted. Pure: it takes the plain dicts engine/code_source.py's `stage_code()` gives (or a
test's), so the page and the classroom draw the same lines.

Quiet by default: one <details> a stage, whose summary names the first function as
`path:line`; it opens on a click. Every text is escaped: Pygments escapes the source it
highlights, `esc` everything else."""
from __future__ import annotations

import re
from functools import cache
from typing import Mapping, Sequence

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

from visualizers._html import esc
from visualizers.i18n import gettext, ngettext

CSS_SCOPE = ".tt-code-src"


BOX_CSS = """
.tt-code-box { margin: 4px 0 8px; font-size: 13px; }
.tt-code-box > summary { cursor: pointer; color: #555; }
.tt-code-box > summary code { color: #1a4d8f; }
.tt-way-ran, .tt-way-not { display: none; }
.tt-way-ran { color: #1b7a2e; font-weight: 600; }
.tt-code-warn { color: #8a5300; }
"""  # the closed line's: the page's own stylesheet holds it


@cache
def code_css() -> str:
    """The view's whole style: the closed line's, then the open view's (src_css)."""
    return BOX_CSS + src_css()


@cache
def src_css() -> str:
    """The open view's style: the highlighting's colours (Pygments' default style), scoped to
    the code view, and its layout; sent with the functions (stage_code_body), not with the page."""
    return HtmlFormatter(style="default").get_style_defs(CSS_SCOPE) + """
.tt-code-fn { margin: 8px 0; }
.tt-code-fn h4 { margin: 4px 0; font-size: 13px; font-weight: 600; }
.tt-code-fn .tt-code-why { color: #555; font-weight: 400; }
.tt-code-src { margin: 0; padding: 4px 0; background: #f7f7f7; border: 1px solid #e3e3e3; border-radius: 4px;
  overflow-x: auto; font-size: 12px; line-height: 1.4; }
.tt-code-src > span > i { display: inline-block; width: 3.5em; padding-right: 0.8em; text-align: right; color: #999;
  font-style: normal; user-select: none; }
.tt-code-src .tt-cl { display: block; white-space: pre; }
.tt-code-src .tt-cm { background: #fff3b0; }
.tt-code-src .tt-cl[data-v]::after { margin-left: 1.5em; padding: 0 6px; color: #0b5394; background: #e8f0fe;
  border-radius: 3px; font-style: italic; }
.tt-code-src .tt-code-gap { display: block; color: #999; font-style: italic; padding-left: 4.3em; }
.tt-code-path { font-size: 12px; color: #555; }
"""


_SPAN = re.compile(r'<span class="([\w-]+)">([^<]*)</span>')


@cache
def _coloured() -> frozenset[str]:
    """The token classes the style colours (whitespace's colour shows nothing): the others' spans only cost bytes."""
    return frozenset(c for c, (style, _, _) in HtmlFormatter(style="default").class2style.items() if style) - {"w"}


def _unwrap(match: re.Match) -> str:
    return match.group(0) if match.group(1) in _coloured() else match.group(2)


@cache
def _highlighted(source: tuple[str, ...]) -> tuple[str, ...]:
    """Each source line as highlighted HTML (Pygments closes its spans at every line's end;
    names, punctuation and spaces, which the style leaves plain, unwrapped: half the bytes)."""
    out = highlight("\n".join(source) + "\n", PythonLexer(stripnl=False, ensurenl=True),
                    HtmlFormatter(nowrap=True)).split("\n")
    out = [_SPAN.sub(_unwrap, line) for line in out[:len(source)]]
    return tuple(out) + ("",) * max(0, len(source) - len(out))


def function_html(entry: Mapping, ran: bool | None = None, path_names: Mapping[str, str] | None = None,
                  lang: str = "en") -> str:
    """One function: `path:line Name`, why it is here, then its shown lines, numbered.
    ran: for a function of one of a stage's ways, whether it is the way that ran (None: unknown);
    lang: the language of the words around the code (the code map's lines are in the catalogs)."""
    if entry.get("error"):
        warn = gettext(lang, "not found in this checkout: {error}", error=entry["error"])
        return f"<div class='tt-code-fn'><h4>{esc(entry['name'])}</h4><div class='tt-code-warn'>{esc(warn)}</div></div>"
    where = f"{entry['file']}:{entry['line']}"
    way = ""
    if entry.get("path"):
        said = gettext(lang, (path_names or {}).get(entry["path"], entry["path"]))
        yes, no = gettext(lang, " · ran for this request"), gettext(lang, " · not taken by this request")
        # unknown when drawn (the page draws the view once): both words, hidden until a request's
        # stage text says which ways ran (code_facts.ways_style shows the right one)
        state = (f"<span class='tt-way-ran'>{esc(yes)}</span><span class='tt-way-not'>{esc(no)}</span>"
                 if ran is None else esc(yes if ran else no))
        one_way = gettext(lang, "one way: {way}", way=said)  # outside the f-string: the extractor reads it
        way = f"<div class='tt-code-path'>{esc(one_way)}{state}</div>"
    lines = _highlighted(tuple(entry["source"]))
    first, marks = entry["line"], set(entry.get("marks", ()))
    values = {at: name for at, name in entry.get("values", ())}  # the request's value goes after it (code_values.py)
    rows, after = [], first
    for start, end in entry["shown"]:
        if start > after:
            rows.append(_gap(after, start - 1, lang))
        for n in range(start, end + 1):
            mark = " tt-cm" if n in marks else ""  # short names: a line's markup is most of the view's bytes
            value = f" data-v='{esc(values[n])}'" if n in values else ""
            rows.append(f"<span class='tt-cl{mark}'{value}><i>{n}</i>"
                        f"{lines[n - first]}</span>")
        after = end + 1
    if after <= entry["end"]:
        rows.append(_gap(after, entry["end"], lang))
    path = f" data-path='{esc(entry['path'])}'" if entry.get("path") else ""
    return (f"<div class='tt-code-fn' data-name='{esc(entry['name'])}'{path}><h4><code>{esc(where)}</code> "
            f"<code>{esc(entry['qualname'])}</code> <span class='tt-code-why'>— {esc(gettext(lang, entry['why']))}</span></h4>{way}"
            f"<pre class='tt-code-src'>{''.join(rows)}</pre></div>")


def _gap(first: int, last: int, lang: str) -> str:
    line = gettext(lang, "⋯ lines {first}–{last} not shown", first=first, last=last)
    return f"<span class='tt-code-gap'>{esc(line)}</span>"


def summary_text(entries: Sequence[Mapping], lang: str = "en") -> str:
    """The closed view's one line: the first function as `path:line Name`, and how many more (the same
    before a request as after it: "Ran for this request" is the stage's line for what ran)."""
    found = [e for e in entries if not e.get("error")]
    if not found:
        return gettext(lang, "The code of this stage: not found in this checkout")
    first = found[0]
    more = ngettext(lang, " and {n} more", " and {n} more", len(entries) - 1) if len(entries) > 1 else ""
    return gettext(lang, "The code of this stage: {function}{more}", more=more,
                   function=f"{first['file']}:{first['line']} {first['qualname']}")


def stage_code_body(entries: Sequence[Mapping], path_names: Mapping[str, str] | None = None,
                    ran: Sequence[str] | None = None, lang: str = "en") -> str:
    """What an open view holds: its style, then every function the map names for the stage (ran: as below)."""
    return f"<style>{src_css()}</style>" + "".join(
        function_html(e, None if ran is None or not e.get("path") else e["path"] in ran, path_names, lang) for e in entries)


def stage_code_html(key: str, entries: Sequence[Mapping], path_names: Mapping[str, str] | None = None,
                    ran: Sequence[str] | None = None, note: str = "", open_: bool = False, src: str = "",
                    lang: str = "en") -> str:
    """A stage's code view: closed, one line; open, every function the map names for it.
    ran: the ways this request took (None: not known, e.g. before a request); note: a warning
    line (a trace from another checkout), plain text; src: where the open view's functions are
    fetched from when it first opens (the page's and the classroom's code.js), "" to hold them here."""
    if not entries:
        return ""
    body = "" if src else stage_code_body(entries, path_names, ran, lang)
    warn = f"<div class='tt-code-warn'>{esc(note)}</div>" if note else ""
    lazy = f" data-src='{esc(src)}'" if src else ""
    return (f"<details class='tt-code-box' data-key='{esc(key)}'{lazy}{' open' if open_ else ''}>"
            f"<summary>{esc(summary_text(entries, lang))}</summary>{warn}{body}</details>")
