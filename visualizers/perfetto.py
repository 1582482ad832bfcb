"""Stages 6 and 11 for Perfetto (ui.perfetto.dev) or chrome://tracing: one request's trace as
Chrome trace-event JSON, complete ("X") slices on a few tracks:

- "engine steps": every engine step that computed this request, split into its phases:
  schedule (the scheduler's pick), forward (draft proposals, the batch's tensors and the
  model's pass), sample, and trace (the events written after sampling, the captures
  included), where the recording has them;
- the request itself: its whole life, tokenize, the queue (arrival to admission), then
  each step it was in (prefill chunk, decode or verify) and an instant per streamed token;
- one track per batch neighbour: the other requests that shared those steps, and how many
  tokens each brought;
- on a sharded engine, one track per rank: each collective of those steps (the batch
  broadcast, the all-reduces after each layer's attention and MLP), when that rank entered
  it and how long it stayed, on rank 0's clock;
- disaggregated (engine/disagg: steps carry `engine` and, with several engines a side,
  `engine_index`): one steps track per engine ("prefill 1 engine steps", "decode 0 engine
  steps"), and a "KV transfer" track naming both: the wait before the send, then the send.
Pure: events in (a recording's, as plain dicts), a JSON-serializable dict out. Times are
microseconds from the request's arrival.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

ENGINE_TID, REQUEST_TID = 1, 2
PREFILL_TID, TRANSFER_TID = 900, 901  # a disaggregated engine's prefill steps, and its KV handover
PREFILL_K_TID, DECODE_K_TID = 910, 950  # + k: prefill engine k's steps, decode engine k's (k > 0)
RANK_TID = 1000  # + rank: the collectives' tracks, after the neighbours'


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def step_phases(step: dict, end: float) -> list[tuple[str, float, float]]:
    """[(phase, start, end)] in seconds (perf_counter), for a `schedule.step` event whose
    step's last event was written at `end`."""
    if "start" not in step:  # a recording from before the phases were traced: the forward pass only
        return [("forward", step["ts"] - step["forward_seconds"], step["ts"])]
    t0 = step["start"]
    t1 = t0 + step["schedule_seconds"]
    t2 = t1 + step["forward_seconds"]
    t3 = t2 + step["sample_seconds"]
    phases = [("schedule", t0, t1), ("forward", t1, t2), ("sample", t2, t3)]
    if end > t3:
        phases.append(("trace", t3, end))
    return phases


def _engine(e: dict) -> tuple:
    """Which engine an event is of: (role, index); (None, None) on one colocated engine."""
    return e.get("engine"), e.get("engine_index")


def _engine_track(role: str | None, index: int | None) -> tuple[int, str]:
    """A steps track: its tid and name. Decode 0 (or the one engine) keeps ENGINE_TID."""
    if role is None:
        return ENGINE_TID, "engine steps"
    name = f"{role} engine steps" if index is None else f"{role} {index} engine steps"
    if role == "prefill":
        return (PREFILL_K_TID + index if index else PREFILL_TID), name
    return (DECODE_K_TID + index if index else ENGINE_TID), name


@dataclass
class _Trace:
    """The trace's events as they are added, times counted from the request's arrival (t0)."""
    t0: float
    events: list[dict] = field(default_factory=list)

    def meta(self, tid: int, name: str, order: int) -> None:
        self.events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}})
        self.events.append({"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": tid,
                            "args": {"sort_index": order}})

    def slice(self, tid: int, name: str, start: float, end: float, cat: str, **args) -> None:
        self.events.append({"ph": "X", "name": name, "cat": cat, "pid": 1, "tid": tid, "ts": _us(start - self.t0),
                            "dur": max(0.0, _us(end - self.t0) - _us(start - self.t0)), "args": args})


def _collectives(trace: _Trace, events: Sequence[dict], request_id: str) -> None:
    """Each rank's collectives in the steps this request was in: a track per rank."""
    ranks: set[int] = set()
    for c in events:
        if c["type"] != "schedule.collective" or not any(b["request_id"] == request_id for b in c["batch"]):
            continue
        for col in c.get("collectives", []):
            for r, (t, ms) in enumerate(zip(col.get("start", ()), col["ms"])):  # no "start": an older file
                if r not in ranks:
                    ranks.add(r)
                    trace.meta(RANK_TID + r, f"rank {r} collectives", 1000 + r)
                where = f" layer {col['layer']}" if col.get("layer") is not None else ""
                trace.slice(RANK_TID + r, f"{col['kind']} {col['what']}{where}", t, t + ms / 1e3, "collective",
                            step=c["step"], layer=col.get("layer"), bytes=col["bytes"], ms=ms)


def _transfers(trace: _Trace, transfers: list[dict]) -> None:
    """Disaggregated: the handover, prefill pool -> decode pool, on a track of its own."""
    for x in transfers:
        if not any(e["ph"] == "M" and e.get("tid") == TRANSFER_TID for e in trace.events):
            trace.meta(TRANSFER_TID, f"KV transfer ({x.get('src', 'prefill')} -> {x.get('dst', 'decode')})", 0)
        t0 = x["start"]
        trace.slice(TRANSFER_TID, "waiting for decode blocks", t0 - x["queue_ms"] / 1e3, t0, "transfer",
                    ms=x["queue_ms"])
        trace.slice(TRANSFER_TID, f"send {x['num_blocks']} blocks ({x['bytes']:,} bytes, {x['backend']})", t0,
                    t0 + x["wire_ms"] / 1e3, "transfer", bytes=x["bytes"], layers=len(x["layers"]), ms=x["wire_ms"],
                    src_blocks=x["src_blocks"], dst_blocks=x["dst_blocks"])


def perfetto_trace(events: Sequence[dict], request_id: str, model: str | None = None) -> dict:
    """events: one request's recording (its own events and the schedule.step events it was in)."""
    steps = [e for e in events if e["type"] == "schedule.step"
             and any(b["request_id"] == request_id for b in e["batch"])]
    mine = [e for e in events if e.get("request_id") == request_id]
    by_type: dict[str, list[dict]] = {}
    for e in mine:
        by_type.setdefault(e["type"], []).append(e)
    arrive = (by_type.get("request.arrive") or [None])[0]
    tok = (by_type.get("tokenize") or [None])[0]
    fin = (by_type.get("finish") or [None])[0]
    if arrive is not None:  # arrival: before tokenizing, which the arrive event follows (its
        # emission can wait for the engine's lock: tokenized_at is when tokenizing ended)
        t_arrival = arrive.get("tokenized_at", arrive["ts"]) - (tok or {}).get("seconds", 0.0)
    else:
        t_arrival = min((e["ts"] for e in events), default=0.0)
    last_ts: dict[int, float] = {}  # each step's last event of this request: the end of its trace phase
    for e in events:
        if e["type"] == "schedule.step" or e.get("request_id") == request_id:
            key = (*_engine(e), e["step"])  # disaggregated: each prefill engine counts its own steps
            last_ts[key] = max(last_ts.get(key, e["ts"]), e["ts"])

    trace = _Trace(t_arrival)
    out, meta, slice_ = trace.events, trace.meta, trace.slice
    out.append({"ph": "M", "name": "process_name", "pid": 1,
                "args": {"name": f"TokenTrace · {model}" if model else "TokenTrace"}})
    apart = any(s.get("engine") for s in steps)
    tracks = {}  # (role, index) -> tid: one steps track per engine that computed this request
    for s in steps or [{}]:
        if _engine(s) not in tracks:
            tracks[_engine(s)], name = _engine_track(*_engine(s))
            meta(tracks[_engine(s)], name, 0)
    meta(REQUEST_TID, f"request {request_id}", 1)
    neighbours: dict[str, int] = {}
    spans = []
    for s in steps:
        phases = step_phases(s, last_ts.get((*_engine(s), s["step"]), s["ts"]))
        start, end = phases[0][1], phases[-1][2]
        spans.append((start, end))
        batch = [f"{b['request_id']}: {b['kind']} {b['num_tokens']} tokens" for b in s["batch"]]
        tid = tracks[_engine(s)]
        slice_(tid, f"step {s['step']}", start, end, "engine", step=s["step"], num_tokens=s["num_tokens"],
               batch=batch, running=s.get("running"), waiting=s.get("waiting"), free_blocks=s.get("free_blocks"),
               **({"engine": s["engine"]} if apart else {}))
        for name, a, b in phases:
            slice_(tid, name, a, b, "phase", step=s["step"])
        me = next(b for b in s["batch"] if b["request_id"] == request_id)
        others = [b["request_id"] for b in s["batch"] if b["request_id"] != request_id]
        slice_(REQUEST_TID, me["kind"], start, end, "request", step=s["step"], start_position=me["start"],
               tokens=me["num_tokens"], batch_neighbours=others)
        for b in s["batch"]:
            if b["request_id"] == request_id:
                continue
            if b["request_id"] not in neighbours:
                neighbours[b["request_id"]] = REQUEST_TID + 1 + len(neighbours)
                meta(neighbours[b["request_id"]], f"neighbour {b['request_id']}", 1 + len(neighbours))
            slice_(neighbours[b["request_id"]], b["kind"], start, end, "neighbour", step=s["step"],
                   tokens=b["num_tokens"], shared_with=request_id)
    _collectives(trace, events, request_id)
    _transfers(trace, by_type.get("kv.transfer", []))
    t_end = max([fin["ts"] if fin else t_arrival] + [e for _, e in spans] + [e["ts"] for e in mine])
    slice_(REQUEST_TID, f"request {request_id}", t_arrival, t_end, "request",
           finish_reason=(fin or {}).get("reason"), usage=(fin or {}).get("usage"), ttft_s=(fin or {}).get("ttft"))
    if tok is not None:
        slice_(REQUEST_TID, "tokenize", t_arrival, t_arrival + tok.get("seconds", 0.0), "request", tokens=tok["count"])
    queued = t_arrival + (tok or {}).get("seconds", 0.0)
    if spans and spans[0][0] > queued:  # tokenized, waiting for the step whose scheduler admits it
        slice_(REQUEST_TID, "queue", queued, spans[0][0], "request")
    for t in by_type.get("token", []):
        out.append({"ph": "i", "s": "t", "name": f"token {t['text']!r}", "cat": "token", "pid": 1,
                    "tid": REQUEST_TID, "ts": _us(t["ts"] - t_arrival),
                    "args": {"index": t["index"], "token_id": t["token_id"], "latency_s": t.get("latency")}})
    meta_events = [e for e in out if e["ph"] == "M"]
    timed = sorted((e for e in out if e["ph"] != "M"), key=lambda e: (e["ts"], -e.get("dur", 0)))
    return {"traceEvents": meta_events + timed, "displayTimeUnit": "ms",
            "otherData": {"source": "TokenTrace", "request_id": request_id, "model": model,
                          "time_origin": "the request's arrival (microseconds)"}}
