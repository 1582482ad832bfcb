"""Classroom mode: one request walked through stage by stage on a projector.

A room holds one recording (a finished request, a loaded trace, or a request still
streaming, re-read while it runs). The presenter's link carries a secret key and
moves the stage (buttons or keyboard); every other viewer of the room's link polls
the room and follows. The page is plain HTML + a little JS (not Gradio): big type,
keyboard control and a cheap poll for thirty browsers.
"""
from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse

from app.limits import RequestRefused
from app.openai_api import read_body, read_json
from app.recording import Recording, ReplayCursor, TraceFileError
from visualizers._html import esc
from visualizers.walkthrough import Stage, stages

REFRESH_EVERY = 0.5  # seconds between re-reads of a request that is still running
MAX_UPLOAD = 16 * 2**20  # a trace posted to make a room (a long fully traced request is a few MB)
MAX_ROOMS = 64


@dataclass
class Room:
    room_id: str
    key: str  # the presenter's secret
    rec: Recording
    refresh: Callable[[], Recording | None] | None = None  # re-reads a live request's trace
    stage: int = 0
    version: int = 0  # bumps when the stage moves or the trace grows
    _stages: list[Stage] = field(default_factory=list)
    _html: dict[int, str] = field(default_factory=dict)
    _read_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def finished(self) -> bool:
        return any(e["type"] == "finish" for e in self.rec.events)

    def update(self) -> None:
        """Re-read a running request (at most every REFRESH_EVERY seconds); build stages once."""
        with self.lock:
            if self.refresh is not None and not self.finished and time.monotonic() - self._read_at > REFRESH_EVERY:
                self._read_at = time.monotonic()
                rec = self.refresh()
                if rec is not None and len(rec.events) != len(self.rec.events):
                    self.rec, self._stages, self._html = rec, [], {}
                    self.version += 1
            if not self._stages:
                cursor = ReplayCursor(self.rec)
                kv_peak = cursor.goto(cursor.peak_kv_frame()).snapshot
                self._stages = stages(self.rec.model, self.rec.request_id, self.rec.body, self.rec.events,
                                      self.rec.outputs, kv_peak, self.rec.truncated)
                self.stage = min(self.stage, len(self._stages) - 1)

    def stage_list(self) -> list[Stage]:
        self.update()
        return self._stages

    def render(self, i: int) -> str:
        """Stage i: its words, then the page's panels for it at the request's last step."""
        all_stages = self.stage_list()
        with self.lock:
            if i not in self._html:
                s = all_stages[i]
                cursor = ReplayCursor(self.rec)
                # the pool while the request still held its blocks; every other panel at the end
                views = {p: (cursor.goto(cursor.peak_kv_frame()) if p == "kv" else None) for p in s.panels}
                html = {p: v.render(p) for p, v in views.items() if v is not None}
                view = cursor.goto(cursor.last_frame)
                body = "".join(f"<div class='tt-class-panel'>{html.get(p) or view.render(p)}</div>" for p in s.panels)
                self._html[i] = (f"<h2 id='tt-class-title'>{esc(s.title)}</h2><div class='tt-class-text'>{s.text}"
                                 f"</div><div class='tt-class-panels'>{body}</div>")
            return self._html[i]

    def goto(self, i: int) -> None:
        n = len(self.stage_list())
        with self.lock:
            i = max(0, min(int(i), n - 1))
            if i != self.stage:
                self.stage, self.version = i, self.version + 1


class Classrooms:
    def __init__(self, max_rooms: int = MAX_ROOMS) -> None:
        self._rooms: OrderedDict[str, Room] = OrderedDict()
        self._lock = threading.Lock()
        self.max_rooms = max_rooms

    def create(self, rec: Recording, refresh: Callable[[], Recording | None] | None = None) -> Room:
        room = Room(secrets.token_urlsafe(6), secrets.token_urlsafe(16), rec, refresh)
        with self._lock:
            self._rooms[room.room_id] = room
            while len(self._rooms) > self.max_rooms:  # the oldest room closes
                self._rooms.popitem(last=False)
        return room

    def get(self, room_id: str) -> Room | None:
        with self._lock:
            return self._rooms.get(room_id)


def _invalid(message: str, param: str | None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                   "code": None}}, status_code=400)


def _missing(room_id: str) -> JSONResponse:
    return JSONResponse({"error": {"message": f"no classroom {room_id!r} (closed, or the server restarted)",
                                   "type": "invalid_request_error", "param": "room_id", "code": "room_not_found"}},
                        status_code=404)


def add_classroom_routes(api: FastAPI, classrooms: Classrooms, css: str,
                         recorder: Callable[[str], Recording | None]) -> None:
    """recorder(request_id): the kept trace of a request (None when there is none)."""
    @api.post("/classroom")
    async def create(request: Request):
        """{"request_id": ID} (a request this server kept) or {"trace": <trace file>} -> the room's links."""
        try:
            body = read_json(await read_body(request, MAX_UPLOAD))
        except RequestRefused as e:
            return JSONResponse({"error": {"message": str(e), "type": e.type, "param": e.param, "code": e.code}},
                                status_code=e.status)
        if ("request_id" in body) == ("trace" in body):
            return _invalid("the body must be {\"request_id\": ID} or {\"trace\": <a trace file>}", None)
        if "trace" in body:
            try:
                rec, refresh = Recording.from_json(body["trace"]), None
            except TraceFileError as e:
                return _invalid(str(e), "trace")
        else:
            rid = body["request_id"]
            rec = recorder(rid) if isinstance(rid, str) else None
            if rec is None:
                return JSONResponse({"error": {"message": f"no trace is kept for {rid!r}", "type":
                                               "invalid_request_error", "param": "request_id",
                                               "code": "trace_not_found"}}, status_code=404)
            refresh = (lambda: recorder(rid)) if not any(e["type"] == "finish" for e in rec.events) else None
        room = classrooms.create(rec, refresh)
        return {"id": room.room_id, "request_id": rec.request_id, "presenter_url": f"/classroom/{room.room_id}?key="
                f"{room.key}", "audience_url": f"/classroom/{room.room_id}", "stages": len(room.stage_list())}

    @api.get("/classroom/{room_id}", response_class=HTMLResponse)
    def classroom_page(room_id: str, key: str = ""):
        room = classrooms.get(room_id)
        if room is None:
            return HTMLResponse(f"<p>No classroom {esc(room_id)}: it was closed or the server restarted.</p>",
                                status_code=404)
        presenter = bool(key) and hmac.compare_digest(key, room.key)
        return HTMLResponse(page_html(room, presenter, css))

    @api.get("/classroom/{room_id}/state")
    def state(room_id: str):
        room = classrooms.get(room_id)
        if room is None:
            return _missing(room_id)
        room.update()
        return {"stage": room.stage, "count": len(room.stage_list()), "version": room.version,
                "finished": room.finished}

    @api.get("/classroom/{room_id}/stage/{index}")
    def stage(room_id: str, index: int):
        room = classrooms.get(room_id)
        if room is None:
            return _missing(room_id)
        n = len(room.stage_list())
        if not 0 <= index < n:
            return JSONResponse({"error": {"message": f"stage must be in [0, {n - 1}]", "type":
                                           "invalid_request_error", "param": "index", "code": None}}, status_code=404)
        return {"index": index, "count": n, "html": room.render(index), "version": room.version}

    @api.post("/classroom/{room_id}/goto")
    async def goto(room_id: str, request: Request):
        room = classrooms.get(room_id)
        if room is None:
            return _missing(room_id)
        try:
            body = await request.json()
            key, i = body["key"], int(body["stage"])
        except (ValueError, KeyError, TypeError):
            return _invalid("the body must be {\"key\": str, \"stage\": int}", None)
        if not isinstance(key, str) or not hmac.compare_digest(key, room.key):
            return JSONResponse({"error": {"message": "only the presenter can move the class", "type":
                                           "permission_error", "param": "key", "code": None}}, status_code=403)
        room.goto(i)
        return {"stage": room.stage, "version": room.version}


def page_html(room: Room, presenter: bool, css: str) -> str:
    titles = [s.title for s in room.stage_list()]
    dots = "".join(f"<button class='tt-class-dot' data-i='{i}' title='{esc(t)}'>{i + 1}</button>"
                   for i, t in enumerate(titles))
    role = ("presenter: → / ← / space / PageDown move the whole class" if presenter else
            "following the presenter")
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>TokenTrace classroom · {esc(room.rec.request_id)}</title>
<style>{css}</style></head>
<body class="tt-class {'tt-presenter' if presenter else 'tt-follower'}">
<header><span class="tt-class-brand">TokenTrace classroom</span> · request <b>{esc(room.rec.request_id)}</b>
 · <span id="tt-class-role">{esc(role)}</span> · stage <b id="tt-class-pos">1</b> of {len(titles)}</header>
<nav id="tt-class-dots">{dots}</nav>
<main id="tt-class-stage"></main>
<footer>{'<button id="tt-class-prev">← Previous</button> <button id="tt-class-next">Next →</button>' if presenter else ''}
</footer>
<script>
const ROOM = {room.room_id!r}, KEY = {(room.key if presenter else '')!r}, COUNT = {len(titles)};
let shown = -1, version = -1, target = 0, pending = 0;  // target: where the presenter's keys have sent the class
async function show(i, v) {{
  if (i === shown && v === version) return;
  const r = await fetch(`/classroom/${{ROOM}}/stage/${{i}}`);
  if (!r.ok) return;
  const d = await r.json();
  document.getElementById('tt-class-stage').innerHTML = d.html;
  document.getElementById('tt-class-pos').textContent = i + 1;
  document.querySelectorAll('.tt-class-dot').forEach(b => b.classList.toggle('tt-on', +b.dataset.i === i));
  document.body.dataset.stage = i;
  shown = i; version = v;
}}
async function poll() {{
  try {{
    const r = await fetch(`/classroom/${{ROOM}}/state`);
    if (r.ok) {{
      const s = await r.json();
      // viewers adopt the room's stage; the presenter only at first (a late poll must not undo its keys)
      if (!KEY || shown < 0) {{ target = s.stage; await show(s.stage, s.version); }}
      else if (!pending && s.stage === target) await show(s.stage, s.version);  // a live trace grew
    }}
  }} catch (e) {{}}
  setTimeout(poll, KEY ? 1500 : 400);
}}
async function go(i) {{
  if (!KEY) return;
  target = Math.max(0, Math.min(COUNT - 1, i));
  if (pending) return;  // the loop below sends the latest target: one request at a time, in order
  pending = 1;
  try {{
    while (true) {{
      const want = target;
      const r = await fetch(`/classroom/${{ROOM}}/goto`, {{method: 'POST',
        headers: {{'Content-Type': 'application/json'}}, body: JSON.stringify({{key: KEY, stage: want}})}});
      if (!r.ok) break;
      const s = await r.json();
      if (want === target) {{ await show(s.stage, s.version); break; }}
    }}
  }} finally {{ pending = 0; }}
}}
if (KEY) {{
  document.addEventListener('keydown', e => {{
    if (['ArrowRight', 'PageDown', ' ', 'Enter'].includes(e.key)) {{ e.preventDefault(); go(target + 1); }}
    else if (['ArrowLeft', 'PageUp', 'Backspace'].includes(e.key)) {{ e.preventDefault(); go(target - 1); }}
    else if (e.key === 'Home') go(0); else if (e.key === 'End') go(COUNT - 1);
  }});
  document.getElementById('tt-class-next').onclick = () => go(target + 1);
  document.getElementById('tt-class-prev').onclick = () => go(target - 1);
  document.querySelectorAll('.tt-class-dot').forEach(b => b.onclick = () => go(+b.dataset.i));
}}
poll();
</script></body></html>"""
