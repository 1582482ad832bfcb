"""What tracing a request added to its times, so the page quotes the engine's own: the
finish event's trace_seconds (the engine thread's tracing work between the request's
arrival and its first draw, and between each two draws; engine/output_processor.py)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OwnTimes:
    ttft: float  # the engine's own time to first token
    ttft_added: float  # what tracing added to it
    per_token: float | None  # the engine's own mean time a token after the first (None: one token)
    added: float  # what tracing added in all, the first token and the rest


def own_times(finish: dict | None) -> OwnTimes | None:
    """None where the finish says nothing of it (untraced, or not finished yet)."""
    traced = (finish or {}).get("trace_seconds")
    if not traced or "ttft" not in finish:
        return None
    lat, added = finish.get("token_latencies") or [], traced.get("token_latencies") or []
    per = (sum(lat) - sum(added)) / len(lat) if lat and len(lat) == len(added) else None
    return OwnTimes(max(0.0, finish["ttft"] - traced["ttft"]), traced["ttft"], per, traced["ttft"] + sum(added))
