"""The speculation experiment's figures and sentences (app/lab/speculation.py's result)."""
from __future__ import annotations

from visualizers import i18n
from visualizers.i18n import N_, gettext
from visualizers.lab import _color, error_y, esc, layout, repeat_range
from visualizers.lab_verdict import compare, seconds, share
from visualizers.lab_words import hover, word

KINDS = ("copy", "code", "prose")


def by_content(settings: list[dict], metric: str, title: str, unit: str, lang: str = i18n.DEFAULT) -> dict:
    """One group per content kind, one bar per setting (title, unit: marked N_, drawn in `lang`)."""
    data, n = [], 1
    unit = gettext(lang, unit)
    for i, s in enumerate(settings):
        m = s["metrics"]
        ys = [m.get(f"{k}_{metric}") for k in KINDS]
        ranges = [repeat_range(s, f"{k}_{metric}") for k in KINDS]
        n = max([n] + [r[2] for r in ranges if r[0] != r[1]])
        data.append({"type": "bar", "name": esc(word(lang, s["setting"]["label"])), "marker": {"color": _color(i)},
                     "x": [word(lang, k) for k in KINDS], "y": ys, "error_y": error_y(ys, ranges),
                     "customdata": [[m.get(f"{k}_accepted"), m.get(f"{k}_proposed"), r[0], r[1], r[2]]
                                    for k, r in zip(KINDS, ranges)],
                     "hovertemplate": hover(lang, N_("%{x}: %{y:.4g} {unit}<br>accepted %{customdata[0]} of "
                                                  "%{customdata[1]} proposed<br>range %{customdata[2]:.4g}–"
                                                  "%{customdata[3]:.4g} over %{customdata[4]} repeats"
                                                  "<extra>%{fullData.name}</extra>"), unit=esc(unit))})
    note = gettext(lang, " · median of {n} repeats, whiskers min–max", n=n) if n > 1 else ""
    return {"data": data, "layout": layout(gettext(lang, title) + note, barmode="group",
                                           yaxis={"title": {"text": esc(unit)}})}


def figures(result: dict, lang: str = i18n.DEFAULT) -> list[dict]:
    settings = result["settings"]
    if not settings:
        return []
    spec = [s for s in settings if s["setting"]["options"].get("draft")]
    return [by_content(spec, "acceptance", N_("Share of proposals the target accepted"), N_("accepted / proposed"),
                       lang),
            by_content(settings, "tokens_per_pass", N_("Tokens per target pass"), N_("tokens / pass"), lang),
            by_content(settings, "tokens_per_s", N_("Tokens per second (this machine)"), N_("tokens / s"), lang)]


WHO = {"ngram": (N_("n-gram lookup"), N_("Counted: n-gram lookup's proposals were accepted {copy} on copy, {code} on "
                                         "code and {prose} on prose ({accepted} of {proposed} on copy): {copy_pass} "
                                         "tokens per target pass on copy against {prose_pass} on prose.")),
       "draft": (N_("the draft model"), N_("Counted: the draft model's proposals were accepted {copy} on copy, {code} "
                                           "on code and {prose} on prose ({accepted} of {proposed} on copy): "
                                           "{copy_pass} tokens per target pass on copy against {prose_pass} on "
                                           "prose."))}


def sentences(result: dict, lang: str = i18n.DEFAULT) -> list[str]:
    by = {s["setting"]["name"]: s["metrics"] for s in result["settings"]}
    out = []
    for name in ("ngram", "draft"):
        m = by.get(name)
        if m is None or m.get("copy_acceptance") is None:
            continue
        out.append(gettext(lang, WHO[name][1], **{k: _pct(m.get(f"{k}_acceptance")) for k in KINDS},
                           accepted=m["copy_accepted"], proposed=m["copy_proposed"],
                           copy_pass=f"{m['copy_tokens_per_pass']:.2f}",
                           prose_pass=f"{m['prose_tokens_per_pass']:.2f}"))
    none = next((s for s in result["settings"] if s["setting"]["name"] == "none"), None)
    if none is not None and out:
        best = max((s for s in result["settings"] if s["setting"]["name"] != "none"),
                   key=lambda s: s["metrics"].get("copy_tokens_per_s") or 0)
        who = gettext(lang, WHO[best["setting"]["name"]][0]) if best["setting"]["name"] in WHO else \
            word(lang, best["setting"]["label"])
        copy = share(best, none, "copy_tokens_per_s", N_("on the copy prompts {who} decoded at {pct} of the speed "
                                                         "without speculation"), N_("tokens/s on copy"), per_s, lang,
                     who=who)
        prose = share(best, none, "prose_tokens_per_s", N_("on prose at {pct}"), N_("tokens/s on prose"), per_s, lang)
        cpu = share(best, none, "cpu_s", N_("with {who} the whole workload took {pct} of the CPU time it took without "
                                            "speculation"), N_("CPU time"), seconds, lang, who=who)
        costlier = compare(best, none, "cpu_s")
        out.append(gettext(lang, "Timed: {cpu}; {copy}; {prose}.", cpu=cpu, copy=copy, prose=prose) + (
            gettext(lang, " On this small model the proposals and the wider verify passes cost more than the passes "
                          "they saved: speculation pays where a target pass is expensive.")
            if costlier.decided and (costlier.ratio or 0) > 1 else ""))
    return out


def per_s(v: float) -> str:
    return f"{v:.0f} tokens/s"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.0%}"
