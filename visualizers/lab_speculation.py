"""The speculation experiment's figures and sentences (app/lab/speculation.py's result)."""
from __future__ import annotations

from visualizers.lab import _color, error_y, esc, layout, repeat_range
from visualizers.lab_verdict import compare, seconds, share

KINDS = ("copy", "code", "prose")


def by_content(settings: list[dict], metric: str, title: str, unit: str) -> dict:
    """One group per content kind, one bar per setting."""
    data, n = [], 1
    for i, s in enumerate(settings):
        m = s["metrics"]
        ys = [m.get(f"{k}_{metric}") for k in KINDS]
        ranges = [repeat_range(s, f"{k}_{metric}") for k in KINDS]
        n = max([n] + [r[2] for r in ranges if r[0] != r[1]])
        data.append({"type": "bar", "name": esc(s["setting"]["label"]), "marker": {"color": _color(i)},
                     "x": list(KINDS), "y": ys, "error_y": error_y(ys, ranges),
                     "customdata": [[m.get(f"{k}_accepted"), m.get(f"{k}_proposed"), r[0], r[1], r[2]]
                                    for k, r in zip(KINDS, ranges)],
                     "hovertemplate": "%{x}: %{y:.4g} " + esc(unit) +
                                      "<br>accepted %{customdata[0]} of %{customdata[1]} proposed"
                                      "<br>range %{customdata[2]:.4g}–%{customdata[3]:.4g} over "
                                      "%{customdata[4]} repeats<extra>%{fullData.name}</extra>"})
    note = f" · median of {n} repeats, whiskers min–max" if n > 1 else ""
    return {"data": data, "layout": layout(title + note, barmode="group", yaxis={"title": {"text": esc(unit)}})}


def figures(result: dict) -> list[dict]:
    settings = result["settings"]
    if not settings:
        return []
    spec = [s for s in settings if s["setting"]["options"].get("draft")]
    return [by_content(spec, "acceptance", "Share of proposals the target accepted", "accepted / proposed"),
            by_content(settings, "tokens_per_pass", "Tokens per target pass", "tokens / pass"),
            by_content(settings, "tokens_per_s", "Tokens per second (this machine)", "tokens / s")]


def sentences(result: dict) -> list[str]:
    by = {s["setting"]["name"]: s["metrics"] for s in result["settings"]}
    out = []
    for name, label in (("ngram", "N-gram lookup"), ("draft", "The draft model")):
        m = by.get(name)
        if m is None or m.get("copy_acceptance") is None:
            continue
        parts = [f"{_pct(m.get(f'{k}_acceptance'))} on {k}" for k in KINDS]
        out.append(f"Counted: {label[0].lower() + label[1:]}'s proposals were accepted {parts[0]}, {parts[1]} and "
                   f"{parts[2]} ({m['copy_accepted']} of {m['copy_proposed']} on copy): "
                   f"{m['copy_tokens_per_pass']:.2f} tokens per target pass on copy against "
                   f"{m['prose_tokens_per_pass']:.2f} on prose.")
    none = next((s for s in result["settings"] if s["setting"]["name"] == "none"), None)
    if none is not None and out:
        best = max((s for s in result["settings"] if s["setting"]["name"] != "none"),
                   key=lambda s: s["metrics"].get("copy_tokens_per_s") or 0)
        who = {"draft": "the draft model", "ngram": "n-gram lookup"}.get(best["setting"]["name"],
                                                                        best["setting"]["label"])
        copy = share(best, none, "copy_tokens_per_s", f"on the copy prompts {who} decoded at {{pct}} of the speed "
                     "without speculation", "tokens/s on copy", per_s)
        prose = share(best, none, "prose_tokens_per_s", "on prose at {pct}", "tokens/s on prose", per_s)
        cpu = share(best, none, "cpu_s", f"with {who} the whole workload took {{pct}} of the CPU time it took "
                    "without speculation", "CPU time", seconds)
        costlier = compare(best, none, "cpu_s")
        out.append(f"Timed: {cpu}; {copy}; {prose}." + (
            " On this small model the proposals and the wider verify passes cost more than the passes they "
            "saved: speculation pays where a target pass is expensive." if costlier.decided and
            (costlier.ratio or 0) > 1 else ""))
    return out


def per_s(v: float) -> str:
    return f"{v:.0f} tokens/s"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.0%}"
