"""The KV-capacity experiment's figures and sentences (app/lab/kv_capacity.py's result), in a
language (visualizers.i18n)."""
from __future__ import annotations

from visualizers import i18n
from visualizers.i18n import N_, gettext
from visualizers.lab import _color, bars, esc, gantt, layout
from visualizers.lab_verdict import count, seconds, share
from visualizers.lab_words import hover, word


def with_preemptions(setting: dict, lang: str = i18n.DEFAULT) -> dict:
    """The setting's Gantt with a red mark where each request lost its pages (hover: step, pages)."""
    fig = gantt(setting, gettext(lang, "{setting}: each request's steps, preemptions marked",
                                 setting=word(lang, setting["setting"]["label"])), lang)
    rows = {r["request_id"]: f"{esc(word(lang, r['role']))} · {esc(r['request_id'])}" for r in setting["per_request"]}
    ev = setting["events"]
    if ev:
        fig["data"].append({"type": "scatter", "mode": "markers", "name": gettext(lang, "preempted"),
                            "x": [e["t_s"] for e in ev], "y": [rows.get(e["request_id"], "") for e in ev],
                            "marker": {"symbol": "x", "size": 12, "color": "#d62828"},
                            "customdata": [[e["step"], e["pages"], e["tokens"]] for e in ev],
                            "hovertemplate": hover(lang, N_("%{y}<br>preempted at step %{customdata[0]}: "
                                                         "%{customdata[1]} pages, %{customdata[2]} tokens to "
                                                         "recompute<extra></extra>"))})
    return fig


def free_pages(settings: list[dict], lang: str = i18n.DEFAULT) -> dict:
    data = [{"type": "scatter", "mode": "lines", "line": {"shape": "hv", "color": _color(i)},
             "name": esc(word(lang, s["setting"]["label"])), "x": [st["start_s"] for st in s["steps"]],
             "y": [st["free_blocks"] for st in s["steps"]],
             "customdata": [[st["step"], st["running"], st["waiting"]] for st in s["steps"]],
             "hovertemplate": hover(lang, N_("step %{customdata[0]}: %{y} free pages, %{customdata[1]} running, "
                                          "%{customdata[2]} waiting<extra>%{fullData.name}</extra>"))}
            for i, s in enumerate(settings)]
    return {"data": data, "layout": layout(gettext(lang, "Free KV pages after each step's schedule"),
                                           xaxis={"title": {"text": gettext(lang, "seconds since the first arrival")}},
                                           yaxis={"title": {"text": gettext(lang, "free pages")}})}


def figures(result: dict, lang: str = i18n.DEFAULT) -> list[dict]:
    settings = result["settings"]
    if not settings:
        return []
    return [bars(settings, (("preemptions", N_("preemptions"), ""),
                            ("recomputed_tokens", N_("tokens recomputed"), N_("tokens")),
                            ("steps", N_("engine steps"), N_("steps"))), N_("What the small pool cost"), lang),
            free_pages(settings, lang)] + [with_preemptions(s, lang) for s in settings]


def sentences(result: dict, lang: str = i18n.DEFAULT) -> list[str]:
    by = {s["setting"]["name"]: s for s in result["settings"]}
    small, ample = by.get("small"), by.get("ample")
    if small is None:
        return []
    m = small["metrics"]
    if not small["events"]:
        return [gettext(lang, "With {pages} pages no request was preempted.", pages=m["num_kv_blocks"])]
    roles = {r["request_id"]: r["role"] for r in small["per_request"]}
    first = small["events"][0]
    times = gettext(lang, "once") if m["preemptions"] == 1 else \
        i18n.ngettext(lang, "{n} time", "{n} times", m["preemptions"])
    out = [gettext(lang, "With {pages} pages the scheduler preempted {times}: first {who} at step {step}, losing "
                         "{lost} pages ({tokens} tokens).", pages=m["num_kv_blocks"], times=times,
                   who=word(lang, roles.get(first["request_id"], first["request_id"])), step=first["step"],
                   lost=first["pages"], tokens=first["tokens"])]
    if ample is not None:
        a = ample["metrics"]
        verdict = share(small, ample, "cpu_s", N_("the small pool's run used {pct} of the ample one's CPU time"),
                        N_("CPU time"), seconds, lang) + gettext(lang, "; ") + share(
            small, ample, "makespan_s", N_("its makespan was {pct} of the ample one's"), N_("makespan"), seconds, lang)
        out.append(gettext(lang, "Recomputing cost {tokens} tokens of prefill, and with fewer requests running at "
                                 "once the workload took {steps} engine steps against {ample_steps} in the "
                                 "{pages}-page pool (counted); timed, {verdict}.",
                           tokens=count(small, "recomputed_tokens", lang), steps=count(small, "steps", lang),
                           ample_steps=count(ample, "steps", lang), pages=a["num_kv_blocks"], verdict=verdict))
    return out
