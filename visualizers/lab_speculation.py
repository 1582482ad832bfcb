"""The speculation experiment's figures and sentences (app/lab/speculation.py's result)."""
from __future__ import annotations

from visualizers.lab import _color, esc, layout

KINDS = ("copy", "code", "prose")


def by_content(settings: list[dict], metric: str, title: str, unit: str) -> dict:
    """One group per content kind, one bar per setting."""
    data = []
    for i, s in enumerate(settings):
        m = s["metrics"]
        data.append({"type": "bar", "name": esc(s["setting"]["label"]), "marker": {"color": _color(i)},
                     "x": list(KINDS), "y": [m.get(f"{k}_{metric}") for k in KINDS],
                     "customdata": [[m.get(f"{k}_accepted"), m.get(f"{k}_proposed")] for k in KINDS],
                     "hovertemplate": "%{x}: %{y:.4g} " + esc(unit) +
                                      "<br>accepted %{customdata[0]} of %{customdata[1]} proposed"
                                      "<extra>%{fullData.name}</extra>"})
    return {"data": data, "layout": layout(title, barmode="group", yaxis={"title": {"text": esc(unit)}})}


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
        out.append(f"{label}'s proposals were accepted {parts[0]}, {parts[1]} and {parts[2]}: "
                   f"{m['copy_tokens_per_pass']:.2f} tokens per target pass on copy against "
                   f"{m['prose_tokens_per_pass']:.2f} on prose.")
    none = by.get("none")
    if none is not None and out:
        best = max((s for s in result["settings"] if s["setting"]["name"] != "none"),
                   key=lambda s: s["metrics"].get("copy_tokens_per_s") or 0)
        b = best["metrics"]
        who = {"draft": "the draft model", "ngram": "n-gram lookup"}.get(best["setting"]["name"],
                                                                        best["setting"]["label"])
        out.append(f"On the copy prompts {who} decoded {b['copy_tokens_per_s']:.0f} tokens/s "
                   f"against {none['copy_tokens_per_s']:.0f} without speculation "
                   f"(prose: {b['prose_tokens_per_s']:.0f} against {none['prose_tokens_per_s']:.0f}).")
    return out


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.0%}"
