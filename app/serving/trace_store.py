"""A bounded store of recent requests' traces, so a page can redraw a panel after the
fact and a trace can be exported, replayed or walked through in classroom mode.

Per request it keeps the trace events (plain dicts: its own, and the step-wide ones that
concern it: schedule.step for the batches it was in, kv.pool for the pool while it was
live), the streamed outputs and the JSON body it came with.

A finished request's events and outputs are packed into JSON strings, one per item:
millions of small dicts and lists kept for 32 requests would make each full garbage
collection walk them all, a pause of hundreds of milliseconds that stalls the engine and
the page alike; strings are objects the collector never looks into. One string per item,
not one for the whole trace: a single json.dumps (at the finish, on the engine thread) or
json.loads (each read) of a multi-MB trace is one C call that holds the GIL throughout,
and a long answer's page fell behind by it; item by item, other threads run in between.

Bounds, in bytes of JSON (what the export would hold; exact once a trace is packed, an
estimate from the payloads' shapes before):
- per request (max_bytes_per_request): past it, the tensor captures (attention,
  embedding rows, MoE routing) are no longer kept, and add() says so once, so the engine
  can stop computing them; the trace is marked `truncated` at the step whose capture met
  the cap (captures of later steps that came before it, built live, are dropped then). The light events (tokens,
  sampling, KV, timing: a few KB per token) go on up to twice the cap; past that only the
  finish is kept and the rest is counted in `dropped` (kv.pool events stop at the first
  one dropped: each says what changed since the one before, so the pool a replay draws
  stays right, as of that step).
- in all (max_total_bytes, plus max_requests): the oldest traces are dropped first, so
  the store never holds more; a pinned trace is never dropped (pinned ones count against
  the bound too: the unpinned go first). One store may serve every model of a server.

With a database (app/store), this store is the hot cache and the database the lasting copy:
its `listener` hears of each trace's start and end (and a refused request's discard), outside
the lock, and queues the write; nothing here waits on the database."""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

MAX_BYTES_PER_REQUEST = 8 * 2**20
MAX_TOTAL_BYTES = 128 * 2**20
HEAVY = {"attention": "probs", "embed": "rows", "moe": "weights"}  # tensor captures: type -> their big list
CAPTURES = (*HEAVY, "logit_lens")  # what stops past the per-request cap (the lens sized as exact JSON)
ALWAYS = ("finish",)  # kept past every bound: a replay needs the end
_SEP = (",", ":")


def event_bytes(item: dict) -> int:
    """An event's size as JSON: exact for the small ones and for captures in the compact form
    (engine/trace/compact.py: a dict holding one base64 string, cheap to measure); for
    captures as nested lists, from the number of values (4 decimals: about 7 bytes each;
    MoE adds an expert id per weight)."""
    key = HEAVY.get(item.get("type"))
    if key is None or isinstance(item.get(key), dict):
        return len(json.dumps(item, separators=_SEP))
    return 400 + (10 if key == "weights" else 7) * _values(item.get(key))


def _values(x) -> int:
    """Numbers in a nested list (counted by the innermost lists' lengths, not one by one)."""
    if not isinstance(x, list) or not x:
        return 0
    if not isinstance(x[0], list):
        return len(x)
    return sum(_values(v) for v in x)


class StoreListener(Protocol):
    """What hears of the traces kept (app/store/library.py: the database's writer)."""

    def started(self, request_id: str, model: str | None, body: dict | None) -> None: ...

    def finished(self, request_id: str) -> None: ...

    def discarded(self, request_id: str) -> None: ...


@dataclass
class StoredTrace:
    events: list[dict] = field(default_factory=list)
    outputs: list[dict] = field(default_factory=list)
    body: dict | None = None
    dropped: int = 0  # events (and outputs) not kept: past a bound
    finished: bool = False
    packed: tuple[list[str], list[str]] | None = None  # events, outputs as JSON items once finished (lists empty)
    model: str | None = None  # the served model that ran it (one store may serve several)
    truncated: dict | None = None  # {"limit_bytes", "step", "captures_dropped"} once a bound cut it
    nbytes: int = 0  # events + outputs + body as JSON (exact once packed)
    pool_cut: bool = False  # a kv.pool event was dropped: the later ones are too
    pinned: bool = False  # never dropped by the bounds

    @property
    def size(self) -> int:
        return self.nbytes

    def pack(self) -> None:
        if self.packed is None:
            self.packed = ([json.dumps(e, separators=_SEP) for e in self.events],
                           [json.dumps(o, separators=_SEP) for o in self.outputs])
            self.events, self.outputs = [], []
            self.nbytes = _packed_bytes(self.packed) + self._body_bytes()

    def _body_bytes(self) -> int:
        return len(json.dumps(self.body, separators=_SEP)) if self.body else 0


def _packed_bytes(packed: tuple[list[str], list[str]]) -> int:
    """len(json.dumps([events, outputs])) without building it: items, commas, brackets."""
    return 3 + sum(2 + sum(map(len, items)) + max(len(items) - 1, 0) for items in packed)


def _unpacked(packed: tuple[list[str], list[str]]) -> tuple[list[dict], list[dict]]:
    return [json.loads(e) for e in packed[0]], [json.loads(o) for o in packed[1]]


class TraceStore:
    def __init__(self, max_requests: int = 32, max_events_per_request: int = 50_000,
                 max_bytes_per_request: int = MAX_BYTES_PER_REQUEST,
                 max_total_bytes: int = MAX_TOTAL_BYTES) -> None:
        if max_total_bytes < 2 * max_bytes_per_request:
            raise ValueError(f"the trace store's budget ({max_total_bytes:,} bytes) must hold at least one whole "
                             f"trace: twice the per-request cap of {max_bytes_per_request:,} bytes")
        self.max_requests = max_requests
        self.max_events = max_events_per_request
        self.max_bytes = max_bytes_per_request
        self.max_total_bytes = max_total_bytes
        self.total_bytes = 0  # sum of every kept trace's size
        self._traces: OrderedDict[str, StoredTrace] = OrderedDict()
        self._gone: OrderedDict[str, None] = OrderedDict()  # dropped: keep out their later events
        self._lock = threading.Lock()
        self.listener: StoreListener | None = None  # the database's side (None: memory only)

    # --- bounds (call with the lock held) -----------------------------------------------
    def _trace(self, request_id: str, model: str | None = None) -> StoredTrace | None:
        tr = self._traces.get(request_id)
        if tr is None and request_id not in self._gone:
            tr = self._traces[request_id] = StoredTrace(model=model)
        return tr

    def _grow(self, tr: StoredTrace, nbytes: int) -> None:
        tr.nbytes += nbytes
        self.total_bytes += nbytes

    def _fit(self) -> None:
        """Drop the oldest unpinned traces until the store is within its bounds."""
        while self._traces and (len(self._traces) > self.max_requests or self.total_bytes > self.max_total_bytes):
            rid = next((r for r, t in self._traces.items() if not t.pinned), None)
            if rid is None:  # every trace kept is pinned
                return
            tr = self._traces.pop(rid)
            self.total_bytes -= tr.size
            self._gone[rid] = None  # a late event (or a running request's next) must not start it again
            while len(self._gone) > 4096:
                self._gone.popitem(last=False)

    def _cut(self, tr: StoredTrace, step: int) -> None:
        if tr.truncated is None:
            tr.truncated = {"limit_bytes": self.max_bytes, "step": step, "captures_dropped": 0}

    def _drop_captures_after(self, tr: StoredTrace, step: int) -> None:
        """The captures of passes after the cut one that came first (a `full` trace builds most
        steps' captures after the step, the newest live: out of step order): none are kept from
        the cut on, so a replay's captures end where its note says."""
        if tr.packed is not None:
            return
        kept = []
        for e in tr.events:
            if e.get("type") in CAPTURES and int(e.get("step", 0)) > step:
                self._grow(tr, -event_bytes(e))
                tr.truncated["captures_dropped"] += 1
            else:
                kept.append(e)
        tr.events = kept

    def _admit(self, tr: StoredTrace, item: dict, size: int) -> bool:
        """Whether the per-request cap lets this event or output in (counting what it leaves out)."""
        if item.get("type") in ALWAYS or item.get("finished"):
            return True
        if tr.nbytes + size > 2 * self.max_bytes or len(tr.events) + len(tr.outputs) >= self.max_events:
            self._cut(tr, int(item.get("step", 0)))
            tr.dropped += 1
            return False
        return True

    # --- writing ---------------------------------------------------------------------
    def add(self, request_id: str, event: dict) -> bool:
        """Keep one event. True the first time the request's tensor captures pass the
        per-request cap: the caller may stop the engine computing them."""
        with self._lock:
            tr = self._trace(request_id, event.get("model"))
            if tr is None:
                return False
            size = event_bytes(event)
            if event.get("type") in CAPTURES and (tr.truncated is not None or tr.nbytes + size > self.max_bytes):
                first = tr.truncated is None
                self._cut(tr, int(event.get("step", 0)))
                if first:
                    self._drop_captures_after(tr, tr.truncated["step"])
                tr.truncated["captures_dropped"] += 1
                return first
            if event.get("type") == "kv.pool" and tr.pool_cut:
                tr.dropped += 1
                return False
            if not self._admit(tr, event, size):
                tr.pool_cut = tr.pool_cut or event.get("type") == "kv.pool"
                return False
            if tr.packed is not None:  # an event after the end (rare): one more packed item
                text = json.dumps(event, separators=_SEP)
                tr.packed[0].append(text)
                self._grow(tr, len(text) + (len(tr.packed[0]) > 1))  # and a comma
            else:
                tr.events.append(event)
                self._grow(tr, size)
            self._fit()
            return False

    def add_output(self, request_id: str, item: dict) -> None:
        if self._add_output(request_id, item) and self.listener is not None:
            self.listener.finished(request_id)

    def _add_output(self, request_id: str, item: dict) -> bool:
        """Keep one output; True when it ended the trace."""
        with self._lock:
            tr = self._traces.get(request_id)
            if tr is None:  # untraced requests keep nothing
                return False
            size = len(json.dumps(item, separators=_SEP))
            if not self._admit(tr, item, size):
                return False
            if tr.packed is not None:  # after the end (rare): one more packed item
                tr.packed[1].append(json.dumps(item, separators=_SEP))
                self._grow(tr, size + (len(tr.packed[1]) > 1))
                self._fit()
                return False
            tr.outputs.append(item)
            self._grow(tr, size)
            ended = item["finished"] and not tr.finished
            tr.finished = tr.finished or item["finished"]
            if tr.finished:
                self.total_bytes -= tr.nbytes
                tr.pack()
                self.total_bytes += tr.nbytes
            self._fit()
            return ended

    def set_body(self, request_id: str, body: dict | None, model: str | None = None) -> None:
        with self._lock:
            tr = self._trace(request_id, model)
            if tr is None:
                return
            size = len(json.dumps(body, separators=_SEP)) if body else 0
            self._grow(tr, size - tr._body_bytes())
            tr.body = body
            if model is not None:
                tr.model = model
            self._fit()
            model = tr.model
        if self.listener is not None and body is not None:
            self.listener.started(request_id, model, body)

    def discard(self, request_id: str) -> None:
        """Forget a trace that holds only its body (a request the engine refused)."""
        with self._lock:
            tr = self._traces.get(request_id)
            if tr is None or tr.events or tr.outputs or tr.packed is not None:
                return
            del self._traces[request_id]
            self.total_bytes -= tr.size
        if self.listener is not None:
            self.listener.discarded(request_id)

    def remove(self, request_id: str) -> bool:
        """Forget a trace (DELETE /v1/traces/{id}); a late event of it keeps out."""
        with self._lock:
            tr = self._traces.pop(request_id, None)
            if tr is None:
                return False
            self.total_bytes -= tr.size
            self._gone[request_id] = None
            return True

    def pin(self, request_id: str, on: bool = True) -> bool:
        """Keep a trace past every bound (on) or let the bounds drop it again; False: none kept."""
        with self._lock:
            tr = self._traces.get(request_id)
            if tr is None:
                return False
            tr.pinned = on
            self._fit()
            return True

    def pinned(self, request_id: str) -> bool:
        with self._lock:
            tr = self._traces.get(request_id)
            return tr is not None and tr.pinned

    # --- reading ---------------------------------------------------------------------
    def get(self, request_id: str) -> list[dict]:
        with self._lock:
            tr = self._traces.get(request_id)
            if tr is None:
                return []
            packed = tr.packed
            events = list(packed[0]) if packed is not None else list(tr.events)
        return [json.loads(e) for e in events] if packed is not None else events

    def trace(self, request_id: str) -> StoredTrace | None:
        """A copy of everything kept for the request (lists copied; their items are shared
        while it runs, and parsed afresh once it is packed)."""
        with self._lock:
            tr = self._traces.get(request_id)
            if tr is None:
                return None
            packed = (list(tr.packed[0]), list(tr.packed[1])) if tr.packed is not None else None  # (an item
            # may still be appended after the end: decode what the copy's sizes count)
            events, outputs = (list(tr.events), list(tr.outputs)) if packed is None else ([], [])
            copy = StoredTrace(events, outputs, tr.body, tr.dropped, tr.finished, model=tr.model,
                               truncated=dict(tr.truncated) if tr.truncated else None, nbytes=tr.nbytes,
                               pinned=tr.pinned)
        if packed is not None:  # decoded outside the lock, item by item
            copy.events, copy.outputs = _unpacked(packed)
        return copy

    def brief(self, request_id: str) -> dict | None:
        """What a list of traces shows, without decoding the trace: body, model, finished,
        pinned, nbytes, tokens (prompt + completion, from the last usage) and the capture level."""
        with self._lock:
            tr = self._traces.get(request_id)
            if tr is None:
                return None
            first = tr.packed[0][0] if tr.packed and tr.packed[0] else (tr.events[0] if tr.events else None)
            last = tr.packed[1][-1] if tr.packed and tr.packed[1] else (tr.outputs[-1] if tr.outputs else None)
            out = {"body": tr.body, "model": tr.model, "finished": tr.finished, "pinned": tr.pinned,
                   "nbytes": tr.nbytes}
        first, last = (json.loads(x) if isinstance(x, str) else x for x in (first, last))
        usage = (last or {}).get("usage") or {}
        out["tokens"] = int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
        out["level"] = first.get("trace_level") if first and first.get("type") == "request.arrive" else None
        return out

    def version(self, request_id: str) -> tuple | None:
        """Changes whenever anything kept for the request does (None: nothing is kept): lets a
        reader reuse what it made from an earlier read."""
        with self._lock:
            tr = self._traces.get(request_id)
            return None if tr is None else (tr.finished, tr.nbytes, tr.dropped)

    def dropped(self, request_id: str) -> int:
        with self._lock:
            tr = self._traces.get(request_id)
            return tr.dropped if tr else 0

    def model_of(self, request_id: str) -> str | None:
        with self._lock:
            tr = self._traces.get(request_id)
            return tr.model if tr else None

    def request_ids(self) -> list[str]:
        with self._lock:
            return list(self._traces)

    def __contains__(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._traces
