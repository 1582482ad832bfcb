"""The KV-capacity experiment's figures and sentences (app/lab/kv_capacity.py's result)."""
from __future__ import annotations

from visualizers.lab import _color, bars, esc, gantt, layout
from visualizers.lab_verdict import count, seconds, share


def with_preemptions(setting: dict) -> dict:
    """The setting's Gantt with a red mark where each request lost its pages (hover: step, pages)."""
    fig = gantt(setting, f"{setting['setting']['label']}: each request's steps, preemptions marked")
    rows = {r["request_id"]: f"{esc(r['role'])} · {esc(r['request_id'])}" for r in setting["per_request"]}
    ev = setting["events"]
    if ev:
        fig["data"].append({"type": "scatter", "mode": "markers", "name": "preempted",
                            "x": [e["t_s"] for e in ev], "y": [rows.get(e["request_id"], "") for e in ev],
                            "marker": {"symbol": "x", "size": 12, "color": "#d62828"},
                            "customdata": [[e["step"], e["pages"], e["tokens"]] for e in ev],
                            "hovertemplate": "%{y}<br>preempted at step %{customdata[0]}: %{customdata[1]} pages, "
                                             "%{customdata[2]} tokens to recompute<extra></extra>"})
    return fig


def free_pages(settings: list[dict]) -> dict:
    data = [{"type": "scatter", "mode": "lines", "line": {"shape": "hv", "color": _color(i)},
             "name": esc(s["setting"]["label"]), "x": [st["start_s"] for st in s["steps"]],
             "y": [st["free_blocks"] for st in s["steps"]],
             "customdata": [[st["step"], st["running"], st["waiting"]] for st in s["steps"]],
             "hovertemplate": "step %{customdata[0]}: %{y} free pages, %{customdata[1]} running, "
                              "%{customdata[2]} waiting<extra>%{fullData.name}</extra>"}
            for i, s in enumerate(settings)]
    return {"data": data, "layout": layout("Free KV pages after each step's schedule",
                                           xaxis={"title": {"text": "seconds since the first arrival"}},
                                           yaxis={"title": {"text": "free pages"}})}


def figures(result: dict) -> list[dict]:
    settings = result["settings"]
    if not settings:
        return []
    return [bars(settings, (("preemptions", "preemptions", ""), ("recomputed_tokens", "tokens recomputed", "tokens"),
                            ("steps", "engine steps", "steps")), "What the small pool cost"),
            free_pages(settings)] + [with_preemptions(s) for s in settings]


def sentences(result: dict) -> list[str]:
    by = {s["setting"]["name"]: s for s in result["settings"]}
    small, ample = by.get("small"), by.get("ample")
    if small is None:
        return []
    m = small["metrics"]
    if not small["events"]:
        return [f"With {m['num_kv_blocks']} pages no request was preempted."]
    roles = {r["request_id"]: r["role"] for r in small["per_request"]}
    first = small["events"][0]
    times = "once" if m["preemptions"] == 1 else f"{m['preemptions']} times"
    out = [f"With {m['num_kv_blocks']} pages the scheduler preempted {times}: first "
           f"{roles.get(first['request_id'], first['request_id'])} at step {first['step']}, losing "
           f"{first['pages']} pages ({first['tokens']} tokens)."]
    if ample is not None:
        a = ample["metrics"]
        verdict = share(small, ample, "cpu_s", "the small pool's run used {pct} of the ample one's CPU time",
                        "CPU time", seconds) + "; " + share(
            small, ample, "makespan_s", "its makespan was {pct} of the ample one's", "makespan", seconds)
        out.append(f"Recomputing cost {count(small, 'recomputed_tokens')} tokens of prefill, and with fewer requests "
                   f"running at once the workload took {count(small, 'steps')} engine steps against "
                   f"{count(ample, 'steps')} in the {a['num_kv_blocks']}-page pool (counted); timed, {verdict}.")
    return out
