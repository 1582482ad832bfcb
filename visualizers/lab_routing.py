"""The routing experiment's figures and sentences (from app/lab/routing.py's result dict):
prefill computed and cached per router, the hit rates, TTFT, and a map of where every
request went (its replica, its system prompt, hit or miss)."""
from __future__ import annotations

import re

from visualizers import i18n
from visualizers.i18n import N_, gettext
from visualizers.lab import SETTING_COLORS, bars, distribution, esc, layout
from visualizers.lab_verdict import seconds, share, span
from visualizers.lab_words import hover, word

PROMPT_COLORS = ("#466ec8", "#f08c1e", "#17803d", "#a050c8")


def figures(result: dict, lang: str = i18n.DEFAULT) -> list[dict]:
    settings = result["settings"]
    if not settings:
        return []
    return [bars(settings, (("prefill_tokens", N_("prefill tokens computed"), N_("tokens")),
                            ("cached_tokens", N_("prompt tokens from the cache"), N_("tokens"))),
                 N_("Prefill computed vs served from the replicas' prefix caches (counted from the trace)"), lang),
            hit_rates(settings, lang),
            distribution([(s["setting"]["label"], [r["ttft_s"] for r in s["per_request"] if r["ttft_s"] is not None])
                          for s in settings], N_("Time to first token per request (measured)"), lang=lang),
            routing_map(settings, lang)]


def hit_rates(settings: list[dict], lang: str = i18n.DEFAULT) -> dict:
    data = [{"type": "bar", "x": [esc(word(lang, s["setting"]["label"])) for s in settings],
             "y": [100 * s["metrics"]["hit_rate"] for s in settings],
             "marker": {"color": [SETTING_COLORS[i % len(SETTING_COLORS)] for i in range(len(settings))]},
             "customdata": [[s["metrics"]["cached_tokens"], s["metrics"]["prompt_tokens"]] for s in settings],
             "hovertemplate": hover(lang, N_("%{x}: %{y:.1f}% of prompt tokens cached<br>%{customdata[0]} of "
                                          "%{customdata[1]}<extra></extra>"))}]
    return {"data": data, "layout": layout(gettext(lang, "Prefix-cache hit rate"), showlegend=False,
                                           yaxis={"title": {"text": gettext(lang, "% of prompt tokens")},
                                                  "range": [0, 100]})}


def routing_map(settings: list[dict], lang: str = i18n.DEFAULT) -> dict:
    """A row per (router, replica), a mark per request in arrival order: its system prompt's
    colour, filled when the replica had its prefix cached (a hit), hollow for a miss."""
    data, rows = [], []
    for s in settings:
        label = word(lang, s["setting"]["label"])
        n = s["metrics"]["replicas"]
        rows += [gettext(lang, "{setting} · replica {n}", setting=esc(label), n=i + 1) for i in range(n)]
        by_id = {r["request_id"]: r for r in s["per_request"]}
        order = {rt["request_id"]: j for j, rt in enumerate(s["extra"]["routes"])}
        reason = {rt["request_id"]: route_reason(lang, rt["reason"]) for rt in s["extra"]["routes"]}
        for k in sorted(set(s["extra"]["system_of"].values())):
            mine = [rid for rid, p in s["extra"]["system_of"].items() if p == k and rid in by_id]
            data.append({
                "type": "scatter", "mode": "markers", "name": gettext(lang, "system prompt {n}", n=k + 1),
                "legendgroup": str(k),
                "showlegend": s is settings[0],
                "x": [order[rid] + 1 for rid in mine],
                "y": [gettext(lang, "{setting} · replica {n}", setting=esc(label), n=s["extra"]["replica_of"][rid] + 1)
                      for rid in mine],
                "marker": {"color": PROMPT_COLORS[k % len(PROMPT_COLORS)], "size": 11,
                           "symbol": ["circle" if by_id[rid]["cached_tokens"] else "circle-open" for rid in mine],
                           "line": {"width": 2, "color": PROMPT_COLORS[k % len(PROMPT_COLORS)]}},
                "customdata": [[esc(rid), by_id[rid]["cached_tokens"], by_id[rid]["prompt_tokens"], esc(reason[rid])]
                               for rid in mine],
                "hovertemplate": hover(lang, N_("%{customdata[0]}<br>%{y}<br>%{customdata[1]} of %{customdata[2]} "
                                                "prompt tokens cached<br>%{customdata[3]}"
                                                "<extra>%{fullData.name}</extra>"))})
    return {"data": data, "layout": layout(gettext(lang, "Where each request went (filled: its prefix was cached "
                                                         "there)"),
                                           height=140 + 34 * len(rows),
                                           xaxis={"title": {"text": gettext(lang, "request, in arrival order")}},
                                           yaxis={"categoryorder": "array", "categoryarray": rows,
                                                  "autorange": "reversed", "automargin": True})}


def spread(setting: dict) -> float:
    """Replicas each system prompt was computed on, on average (1: every prompt stayed on one)."""
    ex = setting["extra"]
    prompts = set(ex["system_of"].values())
    if not prompts:
        return 0.0
    return sum(len({ex["replica_of"][r] for r, p in ex["system_of"].items() if p == k}) for k in prompts) / len(prompts)


def sentences(result: dict, lang: str = i18n.DEFAULT) -> list[str]:
    by = {s["setting"]["name"]: s for s in result["settings"]}
    rr, ll, pa = by.get("round-robin"), by.get("least-loaded"), by.get("prefix-aware")
    if not rr or not pa:
        return []
    m_rr, m_pa = rr["metrics"], pa["metrics"]
    fewer = 1 - m_pa["prefill_tokens"] / m_rr["prefill_tokens"] if m_rr["prefill_tokens"] else 0.0
    num = lambda x: i18n.number(lang, x)  # noqa: E731
    values = dict(replicas=m_pa["replicas"], pa=num(m_pa["prefill_tokens"]), rr=num(m_rr["prefill_tokens"]),
                  share=f"{abs(fewer):.0%}")
    said = gettext(lang, "Counted: on {replicas} replicas, prefix-aware routing computed {pa} prefill tokens against "
                         "{rr} for round-robin ({share} fewer)", **values) if fewer >= 0 else \
        gettext(lang, "Counted: on {replicas} replicas, prefix-aware routing computed {pa} prefill tokens against {rr} "
                      "for round-robin ({share} more)", **values)
    if ll:
        said += gettext(lang, " and {ll} for least-loaded", ll=num(ll["metrics"]["prefill_tokens"]))
    out = [said + gettext(lang, "; its prefix-cache hit rate was {pa} against {rr}.", pa=f"{m_pa['hit_rate']:.0%}",
                          rr=f"{m_rr['hit_rate']:.0%}")]
    out.append(gettext(lang, "Round-robin computed each system prompt on {rr} replicas on average, prefix-aware on "
                             "{pa}: the cache only pays where the requests sharing a prompt land",
                       rr=f"{spread(rr):.1f}", pa=f"{spread(pa):.1f}")
               + (gettext(lang, " (least-loaded: {ll}).", ll=f"{spread(ll):.1f}") if ll else gettext(lang, ".")))
    if m_pa.get("mean_ttft_s") is not None and m_rr.get("mean_ttft_s") is not None:
        verdict = share(pa, rr, "mean_ttft_s", N_("prefix-aware's mean time to first token was {pct} of "
                                                  "round-robin's"), N_("mean time to first token"), seconds, lang)
        cpu = share(pa, rr, "cpu_s", N_("prefix-aware routing used {pct} of round-robin's CPU time"), N_("CPU time"),
                    seconds, lang)
        least = gettext(lang, " (least-loaded: {ll})", ll=span(ll, "mean_ttft_s", seconds)) if ll else ""
        out.append(gettext(lang, "Timed, {cpu}; {verdict}{least}; the busiest replica took {pa} of {n} requests under "
                                 "prefix-aware, {rr} under round-robin.", cpu=cpu, verdict=verdict, least=least,
                           pa=m_pa["max_requests_on_a_replica"], n=m_pa["requests"],
                           rr=m_rr["max_requests_on_a_replica"]))
    return out


# the router's reasons (app/serving/router.py writes them in English into the result): each
# reason's form, then its words in the catalogs
_FIRST = [(re.compile(r"no prompt ids to look up: (.*)"), N_("no prompt ids to look up: {then}")),
          (re.compile(r"no replica holds a prefix of it: (.*)"), N_("no replica holds a prefix of it: {then}")),
          (re.compile(r"loads (\d+)\.\.(\d+) too far apart: (.*)"), N_("loads {lo}..{hi} too far apart: {then}"))]
_CORE = [(re.compile(r"its turn"), N_("its turn")),
         (re.compile(r"least loaded \((\d+) in flight\)"), N_("least loaded ({n} in flight)")),
         (re.compile(r"holds the longest cached prefix \((\d+) tokens\)"),
          N_("holds the longest cached prefix ({n} tokens)"))]


def route_reason(lang: str, reason: str) -> str:
    """The router's reason for a route, in `lang` (a form it does not know: as written)."""
    for form, said in _FIRST:
        if m := form.fullmatch(reason):
            *nums, rest = m.groups()
            return gettext(lang, said, **dict(zip(("lo", "hi"), nums)), then=route_reason(lang, rest))
    for form, said in _CORE:
        if m := form.fullmatch(reason):
            return gettext(lang, said, **({"n": m[1]} if m.groups() else {}))
    return reason
