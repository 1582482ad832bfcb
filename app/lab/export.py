"""A result as JSON, or as one self-contained HTML page: plotly.js inlined from the installed
plotly package (no CDN: the page opens offline), the sentences, the headline table and
every figure. All text is escaped; figures go in as JSON with `</` broken up."""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from app.lab.registry import get


def plotly_js() -> str:
    """plotly.min.js as the installed plotly package ships it."""
    try:
        import plotly
    except ImportError as e:  # requirements.txt lists it
        raise RuntimeError("the HTML export needs the plotly package (pip install plotly)") from e
    return (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_text(encoding="utf-8")


def figures(result: dict) -> list[dict]:
    return get(result["experiment"]).figures(result) if result["settings"] else []


def headline_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """The headline table: a row per setting, a column per headline metric."""
    keys = get(result["experiment"]).headline
    header = ["setting"] + [label for _, label in keys]
    rows = [[s["setting"]["label"]] + [cell(s, k) for k, _ in keys] for s in result["settings"]]
    return header, rows


def cell(setting: dict, key: str) -> str:
    """The median, and its repeats' range where they differed: '0.25 (0.21–0.31)'."""
    sp = setting.get("spread", {}).get(key)
    value = fmt(setting["metrics"].get(key))
    if sp and sp["n"] > 1 and sp["min"] != sp["max"]:
        return f"{value} ({fmt(sp['min'])}–{fmt(sp['max'])})"
    return value


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "–" if v is None else str(v)


def loaded(m: dict) -> str:
    """' · load average 7.9 → 8.3 on 2 CPUs: the timings are noisy' where the machine was busy."""
    a, b, cpus = m.get("load_average"), m.get("load_average_end"), m.get("cpus") or 1
    if a is None or max(a, b or 0) <= cpus:
        return ""
    return f" · load average {a:.1f} → {b if b is None else round(b, 1)} on {cpus} CPUs: the timings are noisy"


def repeats(result: dict) -> str:
    n = result.get("repeats", 1)
    return ("each setting ran once" if n == 1 else
            f"each setting ran {n} times, interleaved: medians, and in brackets and whiskers the min–max")


def to_html(result: dict) -> str:
    e = html.escape
    header, rows = headline_rows(result)
    table = "<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>" + "".join(
        "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows) + "</table>"
    figs = figures(result)
    divs = "".join(f'<div class="fig" id="fig{i}"></div>' for i in range(len(figs)))
    data = json.dumps(figs).replace("</", "<\\/")
    m = result.get("machine", {})
    about = (f"{result['title']} · model {result['model']} · size {result['size']} · {result['started']} · "
             f"{result['seconds']:.1f} s · {repeats(result)} · {m.get('platform', '')} · "
             f"{m.get('threads', '?')} threads"
             f"{loaded(m)}"
             f"{' · cancelled' if result.get('cancelled') else ''}")
    sentences = "".join(f"<p>{e(s)}</p>" for s in result.get("sentences", []))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{e(result['title'])}</title>
<style>body{{font-family:system-ui,sans-serif;color:#1d1d24;max-width:1100px;margin:20px auto;padding:0 12px}}
table{{border-collapse:collapse;font-size:0.9em}}td,th{{border:1px solid #d8dae3;padding:3px 8px;text-align:right}}
th{{background:#f3f4f8}}td:first-child{{text-align:left}}.about{{color:#4f5363;font-size:0.85em}}
.fig{{margin:14px 0;border:1px solid #d8dae3;border-radius:8px}}</style>
<script>{plotly_js()}</script></head><body>
<h1>{e(result['title'])}</h1><p class="about">{e(about)}</p>{sentences}{table}{divs}
<script>const FIGS = {data};
FIGS.forEach((f, i) => Plotly.newPlot('fig' + i, f.data, f.layout, {{responsive: true, displaylogo: false}}));
</script></body></html>
"""


def write_json(result: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result, indent=1), encoding="utf-8")


def write_html(result: dict, path: str | Path) -> None:
    Path(path).write_text(to_html(result), encoding="utf-8")
