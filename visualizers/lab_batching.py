"""The batching experiment's figures and sentences (from app/lab/batching.py's result dict)."""
from __future__ import annotations

from visualizers.lab import bars, gantt, occupancy

HEADLINE = (("makespan_s", "makespan", "s"), ("mean_latency_s", "mean latency", "s"),
            ("p99_latency_s", "p99 latency", "s"))


def figures(result: dict) -> list[dict]:
    settings = result["settings"]
    if not settings:
        return []
    slots = settings[0]["metrics"].get("slots", 1)
    out = [bars(settings, HEADLINE, "Makespan and latency (seconds, measured)"),
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
    by = {s["setting"]["name"]: s["metrics"] for s in result["settings"]}
    out = []
    for arrival in ("together", "staggered"):
        st, co = by.get(f"static-{arrival}"), by.get(f"continuous-{arrival}")
        if not st or not co:
            continue
        out.append(
            f"Arriving {arrival}, static batching took {st['steps']} engine steps and {st['makespan_s']:.2f} s "
            f"for what continuous batching did in {co['steps']} steps and {co['makespan_s']:.2f} s "
            f"(continuous took {_share(co['makespan_s'], st['makespan_s'])} of static's time); p99 latency "
            f"{st['p99_latency_s']:.2f} s against {co['p99_latency_s']:.2f} s.")
    st = by.get("static-together")
    co = by.get("continuous-together")
    if st and co:
        out.append(
            f"The static batches left {st['idle_slot_steps_while_waiting']} slot-steps idle while requests "
            f"waited (continuous: {co['idle_slot_steps_while_waiting']}); their slots were "
            f"{st['occupancy']:.0%} busy against {co['occupancy']:.0%}.")
    return out


def _share(a: float, b: float) -> str:
    return f"{a / b:.0%}" if b else "–"
