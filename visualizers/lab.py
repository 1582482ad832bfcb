"""The lab's figures: pure functions from a result's dict (app/lab's Result.to_json) to
plotly figure dicts ({"data": [...], "layout": {...}}), drawn the same by the page and
the exported HTML. Hover gives the exact measured values. Strings that reach a figure
(roles, labels) are escaped: plotly renders hover text as HTML."""
from __future__ import annotations

import html
from typing import Any, Sequence

KIND_COLOR = {"prefill": "#466ec8", "decode": "#f08c1e", "verify": "#a050c8", "waiting": "#c9ccd8",
              "idle": "#e7e8ef"}
SETTING_COLORS = ("#466ec8", "#f08c1e", "#17803d", "#a050c8", "#d62828", "#4f5363")
FONT = {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12, "color": "#1d1d24"}


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def layout(title: str, **extra: Any) -> dict:
    base = {"title": {"text": esc(title), "font": {"size": 14}}, "font": FONT, "paper_bgcolor": "#fff",
            "plot_bgcolor": "#fbfbfd", "margin": {"l": 70, "r": 20, "t": 48, "b": 48},
            "hoverlabel": {"bgcolor": "#fff", "font": {"family": FONT["family"]}}, "legend": {"orientation": "h"}}
    base.update(extra)
    return base


def ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.1f} ms"


def segments(request: dict, steps_by_number: dict[int, dict]) -> list[dict]:
    """A request's life as bars: waiting (arrival to its first step), then runs of consecutive
    steps of one kind (prefill / decode / verify) merged into one bar each."""
    out: list[dict] = []
    mine = [steps_by_number[n] for n in request["steps"] if n in steps_by_number]
    if mine and mine[0]["start_s"] > request["arrival_s"]:
        out.append({"kind": "waiting", "start": request["arrival_s"], "end": mine[0]["start_s"],
                    "first": None, "last": None, "tokens": 0})
    for st in mine:
        part = next(b for b in st["batch"] if b["request_id"] == request["request_id"])
        last = out[-1] if out else None
        if last is not None and last["kind"] == part["kind"] and last["last"] == st["step"] - 1:
            last["end"], last["last"] = st["start_s"] + st["seconds"], st["step"]
            last["tokens"] += part["num_tokens"]
        else:
            out.append({"kind": part["kind"], "start": st["start_s"], "end": st["start_s"] + st["seconds"],
                        "first": st["step"], "last": st["step"], "tokens": part["num_tokens"]})
    return out


def gantt(setting: dict, title: str | None = None) -> dict:
    """Per-request Gantt of one setting: a row per request, bars for waiting and for its steps."""
    steps = {s["step"]: s for s in setting["steps"]}
    traces: dict[str, dict] = {}
    for r in setting["per_request"]:
        row = f"{esc(r['role'])} · {esc(r['request_id'])}"
        for seg in segments(r, steps):
            t = traces.setdefault(seg["kind"], {
                "type": "bar", "orientation": "h", "name": seg["kind"], "x": [], "base": [], "y": [],
                "marker": {"color": KIND_COLOR[seg["kind"]]}, "customdata": [],
                "hovertemplate": "%{y}<br>%{customdata[0]}<br>%{base:.4f} s → %{customdata[1]:.4f} s"
                                 "<br>%{customdata[2]}<extra>%{fullData.name}</extra>"})
            t["x"].append(seg["end"] - seg["start"])
            t["base"].append(seg["start"])
            t["y"].append(row)
            where = "queued" if seg["first"] is None else (
                f"step {seg['first']}" if seg["first"] == seg["last"] else f"steps {seg['first']}–{seg['last']}")
            t["customdata"].append([where, seg["end"], f"{seg['tokens']} tokens"])
    fig_title = title or f"{setting['setting']['label']}: each request's steps"
    rows = len(setting["per_request"])
    return {"data": list(traces.values()),
            "layout": layout(fig_title, barmode="overlay", height=120 + 26 * rows,
                             xaxis={"title": {"text": "seconds since the first arrival"}},
                             yaxis={"autorange": "reversed", "automargin": True})}


def occupancy(settings: Sequence[dict], slots: int, title: str = "Slot occupancy over time") -> dict:
    """Requests in each step's batch against the slots there are, one line per setting (x: seconds)."""
    data = []
    for i, s in enumerate(settings):
        xs = [st["start_s"] for st in s["steps"]]
        ys = [len(st["batch"]) for st in s["steps"]]
        data.append({"type": "scatter", "mode": "lines", "line": {"shape": "hv", "color": _color(i)},
                     "name": esc(s["setting"]["label"]), "x": xs, "y": ys,
                     "customdata": [[st["step"], st["waiting"]] for st in s["steps"]],
                     "hovertemplate": "step %{customdata[0]}: %{y} busy, %{customdata[1]} waiting"
                                      f" of {slots} slots<br>%{{x:.4f}} s<extra>%{{fullData.name}}</extra>"})
    return {"data": data, "layout": layout(title, xaxis={"title": {"text": "seconds since the first arrival"}},
                                           yaxis={"title": {"text": "requests in the batch"},
                                                  "range": [0, slots + 0.5]},
                                           shapes=[{"type": "line", "xref": "paper", "x0": 0, "x1": 1,
                                                    "y0": slots, "y1": slots,
                                                    "line": {"dash": "dot", "color": "#8a8a96"}}])}


def bars(settings: Sequence[dict], metrics: Sequence[tuple[str, str, str]], title: str) -> dict:
    """Headline bars: one group per metric (key, label, unit), one bar per setting."""
    data = []
    for i, s in enumerate(settings):
        vals = [s["metrics"].get(k) for k, _, _ in metrics]
        data.append({"type": "bar", "name": esc(s["setting"]["label"]), "marker": {"color": _color(i)},
                     "x": [esc(label) for _, label, _ in metrics], "y": vals,
                     "customdata": [unit for _, _, unit in metrics],
                     "hovertemplate": "%{x}: %{y:.6g} %{customdata}<extra>%{fullData.name}</extra>"})
    return {"data": data, "layout": layout(title, barmode="group")}


def distribution(groups: Sequence[tuple[str, Sequence[float]]], title: str, unit: str = "ms",
                 scale: float = 1000.0) -> dict:
    """Box plots with every point: one group per (label, values in seconds)."""
    data = [{"type": "box", "name": esc(label), "y": [v * scale for v in values], "boxpoints": "all",
             "jitter": 0.4, "pointpos": 0, "marker": {"color": _color(i), "size": 4},
             "hovertemplate": f"%{{y:.3f}} {unit}<extra>%{{fullData.name}}</extra>"}
            for i, (label, values) in enumerate(groups)]
    return {"data": data, "layout": layout(title, showlegend=False, yaxis={"title": {"text": unit}})}


def _color(i: int) -> str:
    return SETTING_COLORS[i % len(SETTING_COLORS)]
