"""The batching experiment's figures and sentences (from app/lab/batching.py's result dict), in a
language (visualizers.i18n): the words from the catalogs, the numbers the result's."""
from __future__ import annotations

from visualizers import i18n
from visualizers.i18n import N_, gettext
from visualizers.lab import bars, gantt, occupancy
from visualizers.lab_verdict import count, seconds, share, span

HEADLINE = (("cpu_s", N_("CPU time"), "s"), ("makespan_s", N_("makespan"), "s"),
            ("mean_latency_s", N_("mean latency"), "s"), ("p99_latency_s", N_("p99 latency"), "s"))
ARRIVAL = {"together": N_("Slot occupancy, requests arriving together"),
           "staggered": N_("Slot occupancy, requests arriving staggered")}


def figures(result: dict, lang: str = i18n.DEFAULT) -> list[dict]:
    settings = result["settings"]
    if not settings:
        return []
    slots = settings[0]["metrics"].get("slots", 1)
    out = [bars(settings, HEADLINE, N_("CPU time, makespan and latency (seconds, measured)"), lang),
           bars(settings, (("steps", N_("engine steps"), N_("steps")),
                           ("idle_slot_steps", N_("idle slot-steps"), N_("slot-steps")),
                           ("idle_slot_steps_while_waiting", N_("idle while others waited"), N_("slot-steps"))),
                N_("Engine steps and idle slots (counted from the trace)"), lang)]
    for arrival in ("together", "staggered"):
        group = [s for s in settings if s["setting"]["options"].get("arrival") == arrival]
        if group:
            out.append(occupancy(group, slots, ARRIVAL[arrival], lang))
    out += [gantt(s, lang=lang) for s in settings]
    return out


def sentences(result: dict, lang: str = i18n.DEFAULT) -> list[str]:
    """Per arrival pattern: the engine steps first (counted, exact), then the makespan's verdict
    from the repeats' spread (timed: this machine's)."""
    by = {s["setting"]["name"]: s for s in result["settings"]}
    out = []
    for arrival in ("together", "staggered"):
        st, co = by.get(f"static-{arrival}"), by.get(f"continuous-{arrival}")
        if not st or not co:
            continue
        cpu = share(co, st, "cpu_s", N_("continuous batching used {pct} of static's CPU time"), N_("CPU time"),
                    seconds, lang)
        wall = share(co, st, "makespan_s", N_("it finished in {pct} of static's wall-clock time"),
                     N_("wall-clock time"), seconds, lang)
        said = (N_("Arriving together, continuous batching ran the {n} requests in {steps} engine steps against "
                   "static's {static_steps} (counted, the same on every run). Timed, {cpu}; {wall}; p99 latency "
                   "{p99} against {static_p99}.") if arrival == "together" else
                N_("Arriving staggered, continuous batching ran the {n} requests in {steps} engine steps against "
                   "static's {static_steps} (counted, the same on every run). Timed, {cpu}; {wall}; p99 latency "
                   "{p99} against {static_p99}."))
        out.append(gettext(lang, said, n=len(co["per_request"]), steps=count(co, "steps", lang),
                           static_steps=count(st, "steps", lang), cpu=cpu, wall=wall,
                           p99=span(co, "p99_latency_s", seconds), static_p99=span(st, "p99_latency_s", seconds)))
    st = by.get("static-together")
    co = by.get("continuous-together")
    if st and co:
        out.append(gettext(
            lang, "The static batches left {idle} slot-steps idle while requests waited (continuous: {co_idle}); "
                  "their slots were {busy} busy against {co_busy}.",
            idle=count(st, "idle_slot_steps_while_waiting", lang), co_idle=count(co, "idle_slot_steps_while_waiting",
                                                                                 lang),
            busy=f"{st['metrics']['occupancy']:.0%}", co_busy=f"{co['metrics']['occupancy']:.0%}"))
    return out
