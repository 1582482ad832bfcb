"""A setting's trace events (dicts, as TraceEvent.to_dict gives them) → its RequestRecords
and StepRecords. Every number here is read from an event the engine emitted: `token`
(each token's time since its request arrived), `finish` (TTFT, preemptions, usage),
`schedule.step` (each step's batch, tokens and phases), `kv.transfer` (a disaggregated
engine's handover of a request's pages).

A disaggregated engine's trace holds two engines' steps (each event's "engine": "prefill" or
"decode", numbered each on its own): the records of a setting are the serving engine's (every
step but the prefill side's); step_records(..., engine="prefill") reads the other."""
from __future__ import annotations

import math
from collections import defaultdict

from app.lab.experiment import RequestRecord, StepRecord

# the events a lab run keeps (the rest, sampling candidates and pool maps, are dropped as they come)
KEPT_EVENTS = ("request.arrive", "token", "finish", "schedule.step", "schedule.preempt", "spec",
               "prefix_cache.lookup", "kv.exhausted", "kv.transfer")
PREFILL_SIDE = "prefill"  # a disaggregated engine's prefill engine (engine/disagg)


def on_prefill_side(e: dict) -> bool:
    return e.get("engine") == PREFILL_SIDE


def step_records(events: list[dict], t0: float, engine: str | None = None) -> list[StepRecord]:
    """The serving engine's steps; engine="prefill": a disaggregated engine's prefill side's."""
    out = []
    for e in events:
        if e["type"] != "schedule.step" or on_prefill_side(e) != (engine == PREFILL_SIDE):
            continue
        batch = [{"request_id": b["request_id"], "kind": b["kind"], "num_tokens": b["num_tokens"]} for b in e["batch"]]
        prefill = sum(b["num_tokens"] for b in batch if b["kind"] == "prefill")
        seconds = e["schedule_seconds"] + e["forward_seconds"] + e["sample_seconds"]
        out.append(StepRecord(e["step"], e["start"] - t0, seconds, e["forward_seconds"], e["num_tokens"], prefill,
                              e["num_tokens"] - prefill, batch, e["running"], e["waiting"], e["free_blocks"]))
    return out


def request_records(events: list[dict], t0: float, roles: dict[str, str],
                    arrival_steps: dict[str, int]) -> list[RequestRecord]:
    """One record per request in `roles` (request id → its workload role), in that order."""
    by_request: dict[str, list[dict]] = defaultdict(list)
    steps_of: dict[str, list[int]] = defaultdict(list)
    for e in events:
        if e["type"] == "schedule.step":
            if on_prefill_side(e):  # another engine's step numbers: a request's bars are the serving engine's
                continue
            for b in e["batch"]:
                steps_of[b["request_id"]].append(e["step"])
        elif e["request_id"] is not None:
            by_request[e["request_id"]].append(e)
    return [_request(rid, role, by_request[rid], steps_of[rid], t0, arrival_steps.get(rid, 0))
            for rid, role in roles.items()]


def _request(rid: str, role: str, events: list[dict], steps: list[int], t0: float, arrival_step: int) -> RequestRecord:
    tokens = [e for e in events if e["type"] == "token"]
    finish = next((e for e in events if e["type"] == "finish"), None)
    arrive = next((e for e in events if e["type"] == "request.arrive"), None)
    # a token's time is when its event went out (ts: when a client could see it). Its `t`
    # (sampling time since arrival) is not: a disaggregated request's first token is sampled
    # in the prefill process and goes out only once its pages are in, so ts - t would put the
    # arrival, and with it every token of that request, late by the handover. The arrival is the
    # request.arrive event's, else (untraced arrival) the first token's ts - t.
    arrival = arrive["ts"] if arrive else (tokens[0]["ts"] - tokens[0]["t"] if tokens else t0)
    token_s = [e["ts"] - t0 for e in tokens]
    gaps = [b - a for a, b in zip(token_s, token_s[1:])]
    usage = (finish or {}).get("usage", {})
    return RequestRecord(
        request_id=rid, role=role, prompt_tokens=usage.get("prompt_tokens", 0),
        output_tokens=len(tokens), cached_tokens=usage.get("cached_tokens", 0),
        arrival_step=arrival_step, first_step=tokens[0]["step"] if tokens else None,
        finish_step=finish["step"] if finish else None, arrival_s=arrival - t0,
        first_token_s=token_s[0] if token_s else None, finish_s=token_s[-1] if token_s else None,
        ttft_s=(finish or {}).get("ttft"), latency_s=token_s[-1] - (arrival - t0) if token_s else None,
        token_s=token_s, gaps_s=gaps, preemptions=(finish or {}).get("preemptions", 0),
        finish_reason=(finish or {}).get("reason"), steps=sorted(set(steps)))


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between the closest ranks (numpy's default)."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
