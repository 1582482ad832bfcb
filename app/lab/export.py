"""A result as JSON, or as one self-contained HTML page: plotly.js inlined from the installed
plotly package (no CDN: the page opens offline), the sentences, the headline table and
every figure, in the language it was asked in (the JSON keeps English keys and sentences). All text
is escaped; figures go in as JSON with `</` broken up."""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from babel.numbers import format_decimal

from app.lab.registry import get
from visualizers import i18n
from visualizers.lab_words import word


def plotly_js() -> str:
    """plotly.min.js as the installed plotly package ships it."""
    try:
        import plotly
    except ImportError as e:  # requirements.txt lists it
        raise RuntimeError("the HTML export needs the plotly package (pip install plotly)") from e
    return (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_text(encoding="utf-8")


def figures(result: dict, lang: str = i18n.DEFAULT) -> list[dict]:
    return get(result["experiment"]).figures(result, lang) if result["settings"] else []


def sentences_in(result: dict, lang: str = i18n.DEFAULT) -> list[str]:
    """The result's sentences in `lang`: generated again from its numbers (pure), English as kept."""
    if lang == i18n.DEFAULT or not result["settings"] or result.get("cancelled") or result.get("error"):
        return list(result.get("sentences") or [])
    return get(result["experiment"]).sentences(result, lang)


def title_in(result: dict, lang: str = i18n.DEFAULT) -> str:
    return word(lang, result["title"])


def cancelled_line(result: dict, lang: str = i18n.DEFAULT) -> str:
    return i18n.ngettext(lang, "Cancelled after {n} setting: the numbers below are that setting's only; no "
                         "comparison is drawn.", "Cancelled after {n} settings: the numbers below are those "
                         "settings' only; no comparison is drawn.", len(result["settings"]))


def headline_rows(result: dict, lang: str = i18n.DEFAULT) -> tuple[list[str], list[list[str]]]:
    """The headline table: a row per setting, a column per headline metric (its names in `lang`)."""
    keys = get(result["experiment"]).headline
    header = [word(lang, "setting")] + [word(lang, label) for _, label in keys]
    rows = [[word(lang, s["setting"]["label"])] + [cell(s, k, lang) for k, _ in keys] for s in result["settings"]]
    return header, rows


def cell(setting: dict, key: str, lang: str = i18n.DEFAULT) -> str:
    """The median, and its repeats' range where they differed: '0.25 (0.21–0.31)'."""
    sp = setting.get("spread", {}).get(key)
    value = fmt(setting["metrics"].get(key), lang)
    if sp and sp["n"] > 1 and sp["min"] != sp["max"]:
        return f"{value} ({fmt(sp['min'], lang)}–{fmt(sp['max'], lang)})"
    return value


def fmt(v: Any, lang: str = i18n.DEFAULT) -> str:
    if isinstance(v, float):
        return format_decimal(float(f"{v:.4g}"), format="#,##0.####", locale=lang) if lang != i18n.DEFAULT \
            else f"{v:.4g}"
    return "–" if v is None else str(v)


def loaded(m: dict, lang: str = i18n.DEFAULT) -> str:
    """' · load average 7.9 → 8.3 on 2 CPUs: the timings are noisy' where the machine was busy."""
    a, b, cpus = m.get("load_average"), m.get("load_average_end"), m.get("cpus") or 1
    if a is None or max(a, b or 0) <= cpus:
        return ""
    return " · " + i18n.ngettext(lang, "load average {start} → {end} on {n} CPU: the timings are noisy",
                                 "load average {start} → {end} on {n} CPUs: the timings are noisy", cpus,
                                 start=i18n.number(lang, a, 1), end=b if b is None else i18n.number(lang, b, 1))


def repeats(result: dict, lang: str = i18n.DEFAULT) -> str:
    n = result.get("repeats", 1)
    return (i18n.gettext(lang, "each setting ran once") if n == 1 else
            i18n.gettext(lang, "each setting ran {n} times, interleaved: medians, and in brackets and whiskers the "
                               "min–max", n=n))


def to_html(result: dict, lang: str = i18n.DEFAULT) -> str:
    """The whole page in `lang` (the JSON export keeps its English keys and sentences)."""
    e = html.escape
    header, rows = headline_rows(result, lang)
    table = "<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>" + "".join(
        "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows) + "</table>"
    figs = figures(result, lang)
    divs = "".join(f'<div class="fig" id="fig{i}"></div>' for i in range(len(figs)))
    data = json.dumps(figs).replace("</", "<\\/")
    m = result.get("machine", {})
    about = i18n.gettext(lang, "{title} · model {model} · size {size} · {started} · {seconds} · {repeats} · "
                               "{platform} · {threads} threads", title=title_in(result, lang), model=result["model"],
                         size=result["size"], started=result["started"], seconds=i18n.seconds(lang, result["seconds"]),
                         repeats=repeats(result, lang), platform=m.get("platform", ""), threads=m.get("threads", "?"))
    about += loaded(m, lang) + (" · " + i18n.gettext(lang, "cancelled") if result.get("cancelled") else "")
    said = "".join(f"<p>{e(s)}</p>" for s in sentences_in(result, lang))
    if result.get("cancelled"):
        said += f"<p>{e(cancelled_line(result, lang))}</p>"
    title = e(title_in(result, lang))
    return f"""<!doctype html>
<html lang="{i18n.TAGS.get(lang, 'en')}"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:system-ui,sans-serif;color:#1d1d24;max-width:1100px;margin:20px auto;padding:0 12px}}
table{{border-collapse:collapse;font-size:0.9em}}td,th{{border:1px solid #d8dae3;padding:3px 8px;text-align:right}}
th{{background:#f3f4f8}}td:first-child{{text-align:left}}.about{{color:#4f5363;font-size:0.85em}}
.fig{{margin:14px 0;border:1px solid #d8dae3;border-radius:8px}}</style>
<script>{plotly_js()}</script></head><body>
<h1>{title}</h1><p class="about">{e(about)}</p>{said}{table}{divs}
<script>const FIGS = {data};
FIGS.forEach((f, i) => Plotly.newPlot('fig' + i, f.data, f.layout, {{responsive: true, displaylogo: false}}));
</script></body></html>
"""


def write_json(result: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result, indent=1), encoding="utf-8")


def write_html(result: dict, path: str | Path, lang: str = i18n.DEFAULT) -> None:
    Path(path).write_text(to_html(result, lang), encoding="utf-8")
