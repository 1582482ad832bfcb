"""A recorded request: everything needed to draw every panel at every engine step with
no model loaded. It is the trace file the page exports and loads, what
GET /v1/traces/{id} returns, and what `python -m app --replay FILE` serves.

File format (JSON, "schema": engine.trace.SCHEMA_VERSION): id, model (the served model's
numbers), body (the request as sent), events (trace events, the engine's kv.pool events
for the block pool among them), outputs (streamed tokens, with the engine step that made
them), pieces (token id -> text for every id the panels name), special (special token
ids), dropped (events not kept), truncated (null, or {"limit_bytes", "step",
"captures_dropped"}: the trace reached the server's per-request cap at that step, and the
tensor captures stop there), choices (optional: an n > 1 request's other choices, each the
list of its streamed outputs, request id "<id>.i"; the events are choice 0's, as on the live
page, where the stages trace choice 0 and the others are drawn side by side). Files written
before the pool was an engine event hold it as "snapshots" (sparse pools by step): they load
as kv.pool events.
"""
from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from app.page.live_view import LiveView, truncation_note
from app.serving.requests import parse_body
from engine import LLMEngine
from engine.trace import SCHEMA_VERSION
from visualizers.kv_cache import apply_kv_pool, pool_engine

MODEL_KEYS = ("name", "num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size", "vocab_size",
              "is_moe", "num_blocks", "block_size", "dtype", "dtype_bytes", "kv_cache_bytes")
MAX_FILE_BYTES = 64 * 2**20
BEFORE_STEPS = ("request.arrive", "tokenize")  # emitted when a request is added, before any step runs it
AFTER_STEPS = ("finish", "kv.free")  # an abort between steps stamps these (and its end-of-stream output, no
# token of its own) with a step that did not run it


class TraceFileError(ValueError):
    """The file is not a TokenTrace trace (the message says what is wrong)."""


def pool_events(snapshots: list[dict], request_id: str, events: list[dict]) -> list[dict]:
    """An older file's "snapshots" (the sparse pool after each step) as full kv.pool events,
    each timed like the last event at or before its step."""
    times = sorted((e["step"], float(e.get("ts", 0.0))) for e in events)
    out = []
    for s in snapshots:
        at = bisect.bisect_right(times, (s["step"], math.inf))
        owners, ref, fill, cached = s["owners"], s["ref"], s["fill"], {int(b) for b in s["cached"]}
        blocks = sorted({int(b) for b in owners} | {int(b) for b in ref} | cached)
        out.append({"schema": SCHEMA_VERSION, "type": "kv.pool", "request_id": None, "step": s["step"],
                    "ts": times[at - 1][1] if at else 0.0, "num_blocks": s["num_blocks"],
                    "block_size": s["block_size"], "full": True, "blocks": blocks,
                    "owners": [list(owners.get(str(b), [])) for b in blocks],
                    "ref": [int(ref.get(str(b), 0)) for b in blocks], "fill": [int(fill.get(str(b), 0)) for b in blocks],
                    "cached": [b in cached for b in blocks], "request_ids": [request_id]})
    return out


def token_ids(events: list[dict], outputs: list[dict]) -> set[int]:
    """Every token id a panel may name (generated, sampling candidates, drafts)."""
    ids = {o["token_id"] for o in outputs if o.get("token_id", -1) >= 0}
    for e in events:
        t = e["type"]
        if t == "sample":
            ids.update(e["candidates"])
            ids.add(e.get("token_id", -1))
        elif t == "spec":
            ids.update(e.get("proposed", ()))
            ids.add(e.get("token", -1))
        elif t == "token":
            ids.add(e["token_id"])
    ids.discard(-1)
    return {int(i) for i in ids if isinstance(i, int)}


@dataclass
class Recording:
    request_id: str
    model: dict
    body: dict | None
    events: list[dict]
    outputs: list[dict]
    pieces: dict[int, str] = field(default_factory=dict)
    special: set[int] = field(default_factory=set)
    dropped: int = 0
    truncated: dict | None = None  # the server's per-request cap cut the trace (see trace_store)
    choices: list[list[dict]] = field(default_factory=list)  # n > 1: choices 1.. n-1, their outputs

    # --- files ---------------------------------------------------------------------
    def to_json(self) -> dict:
        out = {"schema": SCHEMA_VERSION, "id": self.request_id, "model": self.model, "body": self.body,
               "events": self.events, "outputs": self.outputs,
               "pieces": {str(i): p for i, p in sorted(self.pieces.items())}, "special": sorted(self.special),
               "dropped": self.dropped, "truncated": self.truncated}
        return out | ({"choices": self.choices} if self.choices else {})

    def dumps(self) -> str:
        """The file's text, encoded item by item: one json.dumps of a multi-MB trace holds the
        GIL for most of a second, stalling the engine thread and every streaming page meanwhile
        (a client polling GET /v1/traces/{id} made a long answer fall seconds behind)."""
        parts = []
        for key, value in self.to_json().items():
            if key in ("events", "outputs"):
                value_text = "[" + ",".join(json.dumps(v, separators=(",", ":")) for v in value) + "]"
            elif key == "choices":
                value_text = "[" + ",".join("[" + ",".join(json.dumps(v, separators=(",", ":")) for v in outs) + "]"
                                            for outs in value) + "]"
            else:
                value_text = json.dumps(value, separators=(",", ":"))
            parts.append(f"{json.dumps(key)}:{value_text}")
        return "{" + ",".join(parts) + "}"

    @classmethod
    def from_json(cls, data: Any) -> "Recording":
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise TraceFileError(f"not a TokenTrace trace file: {what}")

        need(isinstance(data, dict), "the top level must be a JSON object")
        need(data.get("schema") == SCHEMA_VERSION, f"schema must be {SCHEMA_VERSION} (found {data.get('schema')!r})")
        need(isinstance(data.get("id"), str), "'id' must be the request id (a string)")
        model = data.get("model")
        need(isinstance(model, dict), "'model' must be an object")
        missing = [k for k in MODEL_KEYS if k not in model]
        need(not missing, f"'model' lacks {', '.join(missing)}")
        for key in ("events", "outputs", "snapshots"):  # snapshots: an older file's pool (optional)
            items = data.get(key, [] if key == "snapshots" else None)
            need(isinstance(items, list) and all(isinstance(i, dict) for i in items), f"'{key}' must be a list "
                 "of objects")
            need(all(isinstance(i.get("step"), int) for i in items), f"every item of '{key}' needs an int 'step'")
        need(all(isinstance(e.get("type"), str) for e in data["events"]), "every event needs a 'type'")
        # a request at capture level off keeps no events: its streamed outputs (tokens, timing, usage) are the trace
        need(bool(data["events"]) or bool(data["outputs"]), "'events' and 'outputs' are empty: nothing was recorded")
        pieces = data.get("pieces", {})
        need(isinstance(pieces, dict) and all(isinstance(p, str) for p in pieces.values()),
             "'pieces' must map token ids to text")
        choices = data.get("choices", [])
        need(isinstance(choices, list) and all(_choice_ok(data["id"], i, c) for i, c in enumerate(choices, 1)),
             "'choices' must hold, for choice 1, 2 ..., a list of its outputs (request_id '<id>.i', an int 'step')")
        cut = data.get("truncated")
        need(cut is None or (isinstance(cut, dict) and isinstance(cut.get("step"), int)),
             "'truncated' must be null or an object with an int 'step'")
        try:
            events = data["events"]
            if data.get("snapshots"):  # stable: a step's own events before its pool
                events = sorted(events + pool_events(data["snapshots"], data["id"], events), key=lambda e: e["step"])
            return cls(data["id"], model, data.get("body") if isinstance(data.get("body"), dict) else None,
                       events, data["outputs"], {int(i): p for i, p in pieces.items()},
                       {int(i) for i in data.get("special", [])}, int(data.get("dropped", 0)), cut, choices)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise TraceFileError(f"not a TokenTrace trace file: {e}") from None

    @classmethod
    def loads(cls, text: str | bytes) -> "Recording":
        if len(text) > MAX_FILE_BYTES:
            raise TraceFileError(f"the file is over {MAX_FILE_BYTES // 2**20} MiB")
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise TraceFileError(f"not a JSON file: {e}") from None
        return cls.from_json(data)

    # --- steps ---------------------------------------------------------------------
    def steps(self) -> list[int]:
        """The engine steps this request ran in, in order: one replay frame each, so "step k of
        N engine steps" counts what the timeline counts. What happened before its first step (its
        arrival and tokenization, numbered with the engine's last step before it) belongs to
        frame 1; a kv.pool event alone makes no frame (the pool changes at steps that did not
        compute this request too)."""
        outs = self.outputs + [o for c in self.choices for o in c]  # n > 1: until its last choice ends
        ran = {o["step"] for o in outs if o.get("token_id", -1) >= 0} | \
            {e["step"] for e in self.events if e["type"] not in BEFORE_STEPS + AFTER_STEPS and e["type"] != "kv.pool"}
        if not ran:  # ended before any step ran it (aborted while waiting): its end is its one frame (the abort's
            # finish has the step it was asked at, its end-of-stream output the next step's number)
            ends = {e["step"] for e in self.events if e["type"] in AFTER_STEPS} | {o["step"] for o in outs}
            ran = {max(ends)} if ends else set()
        if not ran:  # (nothing at all: its arrival's step, where it has one)
            ran = {e["step"] for e in self.events if e["type"] in BEFORE_STEPS}
        # an arrival numbered after a step that ran it is another engine's count (a disaggregated
        # request's prefill runs on the prefill engine, its arrival is the decode side's): frame 1's too
        return sorted(ran)

    def items(self) -> list[dict]:
        """Events and outputs (every choice's) merged in the order a live watcher got them (a
        step's outputs after its events)."""
        return sorted(self.events + self.outputs + [o for outs in self.choices for o in outs], key=lambda i: i["step"])

    def new_view(self) -> LiveView:
        view = LiveView(model=self.model, piece=lambda i: self.pieces.get(i, f"<{i}>"),
                        is_special=lambda i: i in self.special, live=False)
        show_accepted(view, self.request_id, self.body, "accepted (recorded)")
        view.n = 1 + len(self.choices)  # the Choices panel draws them side by side as the live page did
        note = truncation_note(self.truncated, self.dropped)
        if note and view.validation:
            view.validation["checks"] = list(view.validation["checks"]) + [("trace", True, note)]
        return view


def _choice_ok(request_id: str, i: int, outputs: Any) -> bool:
    """Choice i's outputs as a file holds them: output items of request "<id>.i", each with its step."""
    return isinstance(outputs, list) and all(
        isinstance(o, dict) and o.get("type") == "output" and o.get("request_id") == f"{request_id}.{i}"
        and isinstance(o.get("step"), int) for o in outputs)


def show_accepted(view: LiveView, request_id: str, body: dict | None, note: str) -> None:
    """Fill a view's request panel for a request the engine took from someone else (a
    recording, another client): its body and the checks it passed."""
    view.request_id, view.body = request_id, body or {}
    if not body:
        return
    try:
        sub = parse_body(body)
        view.speculative = sub.speculative
        view.validation = {"ok": True, "request_id": request_id, "checks": sub.checks + [("engine", True, note)]}
    except ValueError as e:  # a hand-edited file
        view.validation = {"ok": False, "error": str(e), "checks": getattr(e, "checks", [])}


class ReplayCursor:
    """A view of a recording at one frame (frame i = after the i-th step of the request).
    Moving forward adds only the new items; moving back rebuilds."""

    def __init__(self, rec: Recording) -> None:
        self.rec = rec
        self.steps = rec.steps()
        self._items = rec.items()
        self.frame = -1
        self._pos = 0
        self.view = rec.new_view()
        self._t: dict[int, float] = {}  # step -> when it happened (engine clock)
        for e in rec.events:
            self._t.setdefault(e["step"], float(e.get("ts", 0.0)))

    @property
    def last_frame(self) -> int:
        return max(0, len(self.steps) - 1)

    def goto(self, frame: int) -> LiveView:
        frame = max(0, min(int(frame), self.last_frame))
        if frame < self.frame:
            layer, head = self.view.layer, self.view.head
            self.view, self._pos = self.rec.new_view(), 0
            self.view.layer, self.view.head = layer, head
        step = self.steps[frame] if self.steps else 0
        end = self._pos
        while end < len(self._items) and self._items[end]["step"] <= step:
            end += 1
        if frame == self.last_frame:  # its end too (an abort's finish comes with the next step's number)
            end = len(self._items)
        self.view.add(self._items[self._pos:end])  # its kv.pool events too: the pool after that step
        self._pos, self.frame = end, frame
        return self.view

    def adopt(self, view: LiveView) -> None:
        """Take a view already fed the whole recording (the live one) as the last frame."""
        self.view, self.frame, self._pos = view, self.last_frame, len(self._items)

    def peak_kv_frame(self) -> int:
        """The last frame at which the request's blocks held the most tokens (its very last
        frame has freed them), counted in every decode engine's pool (disaggregated with
        --decode-ranks > 1, its pages live in the pool of the engine it decoded on)."""
        best, best_n, rid = self.last_frame, -1, self.rec.request_id
        pools = [(j, e) for e in self.rec.events if (j := pool_engine(e)) is not None]
        by_engine: dict[int, dict] = {}
        i = 0
        for f, step in enumerate(self.steps):
            while i < len(pools) and pools[i][1]["step"] <= step:
                j, e = pools[i]
                by_engine[j], i = apply_kv_pool(by_engine.get(j), e), i + 1
            n = sum(pool["fill"].get(b, 0) for pool in by_engine.values()
                    for b, owners in pool["owners"].items() if rid in owners)
            if n >= best_n:
                best, best_n = f, n
        return best

    def seconds_to_next(self) -> float:
        """Engine time between this frame and the next, from the events' timestamps."""
        if self.frame + 1 > self.last_frame:
            return 0.0
        a, b = self._t.get(self.steps[self.frame]), self._t.get(self.steps[self.frame + 1])
        return max(0.0, b - a) if a is not None and b is not None else 0.0


def record_request(store, request_id: str, model: dict, piece: Callable[[int], str],
                   is_special: Callable[[int], bool]) -> Recording | None:
    """The stored trace of one request as a Recording (None when nothing is kept)."""
    tr = store.trace(request_id)
    if tr is None or not tr.events:
        return None
    ids = token_ids(tr.events, tr.outputs)
    for e in tr.events:
        if e["type"] == "tokenize":
            ids.update(t["id"] for t in e["tokens"])
    return Recording(request_id, model, tr.body, tr.events, tr.outputs, {i: piece(i) for i in ids},
                     {i for i in ids if is_special(i)}, tr.dropped, tr.truncated,
                     choice_outputs(store, request_id, tr.body))


def choice_outputs(store, request_id: str, body: dict | None) -> list[list[dict]]:
    """An n > 1 request's other choices, each its streamed outputs (the store keeps each choice's
    trace under its own id; one evicted or never traced ends the list there: the kept ones
    stay in choice order)."""
    n = (body or {}).get("n")
    if not isinstance(n, int) or isinstance(n, bool) or n <= 1:
        return []
    out = []
    for cid in LLMEngine.choice_ids(request_id, n)[1:]:
        tr = store.trace(cid)
        if tr is None or not tr.outputs:
            break
        out.append(list(tr.outputs))
    return out
