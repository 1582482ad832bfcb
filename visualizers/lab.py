"""The lab's figures: pure functions from a result's dict (app/lab's Result.to_json) to
plotly figure dicts ({"data": [...], "layout": {...}}), drawn the same by the page and
the exported HTML. Hover gives the exact measured values. Strings that reach a figure
(roles, labels) are escaped: plotly renders hover text as HTML."""
from __future__ import annotations

import html
from typing import Any, Sequence

from visualizers import i18n
from visualizers.i18n import N_, gettext
from visualizers.lab_words import hover, word

KIND_COLOR = {"prefill": "#466ec8", "decode": "#f08c1e", "verify": "#a050c8", "waiting": "#c9ccd8",
              "idle": "#e7e8ef"}
SETTING_COLORS = ("#466ec8", "#f08c1e", "#17803d", "#a050c8", "#d62828", "#4f5363")
FONT = {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12, "color": "#1d1d24"}


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def layout(title: str, **extra: Any) -> dict:
    base = {"title": {"text": esc(title), "font": {"size": 14}}, "font": FONT, "paper_bgcolor": "#fff",
            "plot_bgcolor": "#fbfbfd", "margin": {"l": 70, "r": 20, "t": 48, "b": 90},
            "hoverlabel": {"bgcolor": "#fff", "font": {"family": FONT["family"]}}, "legend": {"orientation": "h", "yanchor": "top", "y": -0.18}}
    base.update(extra)
    return base


def ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.1f} ms"


def segments(request: dict, steps_by_number: dict[int, dict]) -> list[dict]:
    """A request's life as bars: waiting (arrival to its first step, and any stretch of engine
    steps it sat out: preempted, or a static batch's late member), then runs of consecutive
    steps of one kind (prefill / decode / verify) merged into one bar each."""
    out: list[dict] = []
    mine = [steps_by_number[n] for n in request["steps"] if n in steps_by_number]
    if mine and mine[0]["start_s"] > request["arrival_s"]:
        out.append(_bar("waiting", request["arrival_s"], mine[0]["start_s"], None, None, 0))
    for st in mine:
        part = next(b for b in st["batch"] if b["request_id"] == request["request_id"])
        last = out[-1] if out else None
        end = st["start_s"] + st["seconds"]
        if last is not None and last["last"] is not None and last["last"] < st["step"] - 1 and \
                any(last["last"] < n < st["step"] for n in steps_by_number):  # steps ran without it
            out.append(_bar("waiting", last["end"], st["start_s"], last["last"] + 1, st["step"] - 1, 0))
            last = None
        if last is not None and last["kind"] == part["kind"] and last["last"] == st["step"] - 1:
            last["end"], last["last"] = end, st["step"]
            last["tokens"] += part["num_tokens"]
        else:
            out.append(_bar(part["kind"], st["start_s"], end, st["step"], st["step"], part["num_tokens"]))
    return out


def _bar(kind: str, start: float, end: float, first: int | None, last: int | None, tokens: int) -> dict:
    return {"kind": kind, "start": start, "end": end, "first": first, "last": last, "tokens": tokens}


def gantt(setting: dict, title: str | None = None, lang: str = i18n.DEFAULT) -> dict:
    """Per-request Gantt of one setting: a row per request, bars for waiting and for its steps
    (title: already in `lang`)."""
    steps = {s["step"]: s for s in setting["steps"]}
    traces: dict[str, dict] = {}
    rows = [f"{esc(word(lang, r['role']))} · {esc(r['request_id'])}" for r in setting["per_request"]]
    for r, row in zip(setting["per_request"], rows):
        for seg in segments(r, steps):
            t = traces.setdefault(seg["kind"], {
                "type": "bar", "orientation": "h", "name": word(lang, seg["kind"]), "x": [], "base": [], "y": [],
                "marker": {"color": KIND_COLOR[seg["kind"]]}, "customdata": [],
                "hovertemplate": "%{y}<br>%{customdata[0]}<br>%{base:.4f} s → %{customdata[1]:.4f} s"
                                 "<br>%{customdata[2]}<extra>%{fullData.name}</extra>"})
            t["x"].append(seg["end"] - seg["start"])
            t["base"].append(seg["start"])
            t["y"].append(row)
            first, last = seg["first"], seg["last"]
            where = gettext(lang, "queued") if first is None else \
                gettext(lang, "sat out steps {first}–{last}", first=first, last=last) if seg["kind"] == "waiting" \
                else gettext(lang, "step {n}", n=first) if first == last else \
                gettext(lang, "steps {first}–{last}", first=first, last=last)
            t["customdata"].append([where, seg["end"], i18n.ngettext(lang, "{n} token", "{n} tokens", seg["tokens"])])
    fig_title = title or gettext(lang, "{setting}: each request's steps",
                                 setting=word(lang, setting["setting"]["label"]))
    return {"data": list(traces.values()),
            "layout": layout(fig_title, barmode="overlay", height=120 + 26 * len(rows),
                             xaxis={"title": {"text": gettext(lang, "seconds since the first arrival")}},
                             yaxis={"autorange": "reversed", "automargin": True, "categoryorder": "array",
                                    "categoryarray": rows})}


def occupancy(settings: Sequence[dict], slots: int, title: str = "Slot occupancy over time",
              lang: str = i18n.DEFAULT) -> dict:
    """Requests in each step's batch against the slots there are, one line per setting (x: seconds),
    and above it, shaded, the slots that stayed idle while requests waited: the waste."""
    data = []
    for i, s in enumerate(settings):
        label = esc(word(lang, s["setting"]["label"]))
        xs = [st["start_s"] for st in s["steps"]]
        ys = [len(st["batch"]) for st in s["steps"]]
        data.append({"type": "scatter", "mode": "lines", "line": {"shape": "hv", "color": _color(i)},
                     "name": label, "x": xs, "y": ys, "legendgroup": label,
                     "customdata": [[st["step"], st["waiting"]] for st in s["steps"]],
                     "hovertemplate": hover(lang, N_("step %{customdata[0]}: %{y} busy, %{customdata[1]} waiting of "
                                                  "{slots} slots<br>%{x:.4f} s<extra>%{fullData.name}</extra>"),
                                            slots=slots)})
        waste = [min(slots, len(st["batch"]) + st["waiting"]) for st in s["steps"]]
        data.append({"type": "scatter", "mode": "lines", "line": {"shape": "hv", "width": 0}, "x": xs, "y": waste,
                     "fill": "tonexty", "fillcolor": "rgba(214, 40, 40, 0.18)", "legendgroup": label,
                     "name": i18n.gettext(lang, "{setting}: idle while others waited", setting=label),
                     "customdata": [w - y for w, y in zip(waste, ys)],
                     "hovertemplate": hover(lang, N_("%{customdata} idle slots while requests waited"
                                                  "<extra>%{fullData.name}</extra>"))})
    return {"data": data, "layout": layout(i18n.gettext(lang, title),
                                           xaxis={"title": {"text": i18n.gettext(lang, "seconds since the first "
                                                                                       "arrival")}},
                                           yaxis={"title": {"text": i18n.gettext(lang, "requests in the batch")},
                                                  "range": [0, slots + 0.5]},
                                           shapes=[{"type": "line", "xref": "paper", "x0": 0, "x1": 1,
                                                    "y0": slots, "y1": slots,
                                                    "line": {"dash": "dot", "color": "#8a8a96"}}])}


def bars(settings: Sequence[dict], metrics: Sequence[tuple[str, str, str]], title: str,
         lang: str = i18n.DEFAULT) -> dict:
    """Headline bars: one group per metric (key, label, unit), one bar per setting (title and
    labels: English, marked N_ where written; drawn in `lang`)."""
    data, n = [], 1
    for i, s in enumerate(settings):
        vals = [s["metrics"].get(k) for k, _, _ in metrics]
        ranges = [repeat_range(s, k) for k, _, _ in metrics]
        data.append({"type": "bar", "name": esc(word(lang, s["setting"]["label"])), "marker": {"color": _color(i)},
                     "x": [esc(word(lang, label)) for _, label, _ in metrics], "y": vals,
                     "customdata": [[word(lang, unit), r[0], r[1], r[2]] for (_, _, unit), r in zip(metrics, ranges)],
                     "texttemplate": "%{y:.4~g}", "textposition": "outside",
                     "error_y": error_y(vals, ranges),
                     "hovertemplate": hover(lang, N_("%{x}: %{y:.6g} %{customdata[0]}<br>range %{customdata[1]:.6g}–"
                                                  "%{customdata[2]:.6g} over %{customdata[3]} repeats"
                                                  "<extra>%{fullData.name}</extra>"))})
        n = max([n] + [r[2] for r in ranges if r[0] != r[1]])  # counts: exact, no whiskers to explain
    note = i18n.gettext(lang, " · median of {n} repeats, whiskers min–max", n=n) if n > 1 else ""
    return {"data": data, "layout": layout(i18n.gettext(lang, title) + note, barmode="group")}


def repeat_range(setting: dict, key: str) -> tuple[float | None, float | None, int]:
    """(min, max, repeats) of a metric over the setting's repeats; one run: its value, 1."""
    sp = setting.get("spread", {}).get(key)
    if sp:
        return sp["min"], sp["max"], sp["n"]
    v = setting["metrics"].get(key)
    return v, v, 1


def error_y(medians: Sequence[float | None], ranges: Sequence[tuple]) -> dict:
    """Plotly's asymmetric error bars from each median to its repeats' min and max."""
    up = [(hi - m) if m is not None and hi is not None else 0 for m, (_, hi, _) in zip(medians, ranges)]
    down = [(m - lo) if m is not None and lo is not None else 0 for m, (lo, _, _) in zip(medians, ranges)]
    return {"type": "data", "symmetric": False, "array": up, "arrayminus": down, "visible": True,
            "color": "#1d1d24", "thickness": 1.5, "width": 6}


def stream_gaps(settings: Sequence[dict]) -> list[tuple[str, list[float]]]:
    """Each setting's label and the gaps between tokens of its requests in the "stream" role
    (the chunked-prefill and disaggregation experiments' decoding streams)."""
    return [(s["setting"]["label"], [g for r in s["per_request"] if r["role"] == "stream" for g in r["gaps_s"]])
            for s in settings]


def distribution(groups: Sequence[tuple[str, Sequence[float]]], title: str, unit: str = "ms",
                 scale: float = 1000.0, lang: str = i18n.DEFAULT) -> dict:
    """Box plots with every point: one group per (label, values in seconds)."""
    data = [{"type": "box", "name": esc(word(lang, label)), "y": [v * scale for v in values], "boxpoints": "all",
             "jitter": 0.4, "pointpos": 0, "marker": {"color": _color(i), "size": 4},
             "hovertemplate": f"%{{y:.3f}} {unit}<extra>%{{fullData.name}}</extra>"}
            for i, (label, values) in enumerate(groups)]
    return {"data": data, "layout": layout(i18n.gettext(lang, title), showlegend=False,
                                           yaxis={"title": {"text": unit}})}


def _color(i: int) -> str:
    return SETTING_COLORS[i % len(SETTING_COLORS)]
