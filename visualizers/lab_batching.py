"""The batching experiment's figures and sentences (from app/lab/batching.py's result dict)."""
from __future__ import annotations

from visualizers.lab import bars, gantt, occupancy
from visualizers.lab_verdict import count, seconds, share, span

HEADLINE = (("cpu_s", "CPU time", "s"), ("makespan_s", "makespan", "s"), ("mean_latency_s", "mean latency", "s"),
            ("p99_latency_s", "p99 latency", "s"))


def figures(result: dict) -> list[dict]:
    settings = result["settings"]
    if not settings:
        return []
    slots = settings[0]["metrics"].get("slots", 1)
    out = [bars(settings, HEADLINE, "CPU time, makespan and latency (seconds, measured)"),
           bars(settings, (("steps", "engine steps", "steps"), ("idle_slot_steps", "idle slot-steps", "slot-steps"),
                           ("idle_slot_steps_while_waiting", "idle while others waited", "slot-steps")),
                "Engine steps and idle slots (counted from the trace)")]
    for arrival in ("together", "staggered"):
        group = [s for s in settings if s["setting"]["options"].get("arrival") == arrival]
        if group:
            out.append(occupancy(group, slots, f"Slot occupancy, requests arriving {arrival}"))
    out += [gantt(s) for s in settings]
    return out


def sentences(result: dict) -> list[str]:
    """Per arrival pattern: the engine steps first (counted, exact), then the makespan's verdict
    from the repeats' spread (timed: this machine's)."""
    by = {s["setting"]["name"]: s for s in result["settings"]}
    out = []
    for arrival in ("together", "staggered"):
        st, co = by.get(f"static-{arrival}"), by.get(f"continuous-{arrival}")
        if not st or not co:
            continue
        n = len(co["per_request"])
        cpu = share(co, st, "cpu_s", "continuous batching used {pct} of static's CPU time", "CPU time", seconds)
        wall = share(co, st, "makespan_s", "it finished in {pct} of static's wall-clock time", "wall-clock time",
                     seconds)
        out.append(
            f"Arriving {arrival}, continuous batching ran the {n} requests in {count(co, 'steps')} engine steps "
            f"against static's {count(st, 'steps')} (counted, the same on every run). Timed, {cpu}; {wall}; "
            f"p99 latency {span(co, 'p99_latency_s', seconds)} against {span(st, 'p99_latency_s', seconds)}.")
    st = by.get("static-together")
    co = by.get("continuous-together")
    if st and co:
        out.append(
            f"The static batches left {count(st, 'idle_slot_steps_while_waiting')} slot-steps idle while requests "
            f"waited (continuous: {count(co, 'idle_slot_steps_while_waiting')}); their slots were "
            f"{st['metrics']['occupancy']:.0%} busy against {co['metrics']['occupancy']:.0%}.")
    return out
