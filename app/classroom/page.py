"""The classroom's page (presenter, follower, or a static bundle's index.html): a small HTML
skeleton around classroom.js and classroom.css, which are files of their own so they can be
read, linted and cached as what they are. The room's settings reach the script as CONFIG."""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Protocol

from app.classroom.push import KEEPALIVE
from app.serving.recording import Recording
from visualizers._html import esc
from visualizers.walkthrough import Stage

HERE = Path(__file__).parent


@cache
def asset(name: str) -> str:
    return (HERE / name).read_text()


class Room(Protocol):
    """What the page reads of a room (app/classroom/rooms.py's Room)."""
    room_id: str
    key: str
    rec: Recording

    def stage_list(self) -> list[Stage]: ...


def script_json(value: object) -> str:
    """JSON safe inside <script>: no "</script>" can end it early."""
    return json.dumps(value).replace("</", "<\\/")


def page_html(room: Room, presenter: bool, css: str, server: str = "", static: bool = False) -> str:
    """server: the origin the page follows (empty: its own); static: a bundle's page, which
    reads the stages from its own files (stages/N.json) and only the position from the server."""
    titles = [s.title for s in room.stage_list()]
    sample_stage = next((i for i, s in enumerate(room.stage_list()) if s.key == "sampling"), -1)
    dots = "".join(f"<button class='tt-class-dot' data-i='{i}' title='{esc(t)}'>{i + 1}</button>"
                   for i, t in enumerate(titles))
    role = ("presenter: → / ← / space / PageDown move the whole class" if presenter else
            "following the presenter")
    ask = ("<span class='tt-q-presenter'><button id='tt-q-open' hidden>Ask the class: predict the next token"
           "</button> <span class='tt-q-error' id='tt-q-ask-err'></span></span>" if presenter else "")
    nav = '<button id="tt-class-prev">← Previous</button> <button id="tt-class-next">Next →</button>' if presenter else ""
    config = {"room": room.room_id, "key": room.key if presenter else "", "count": len(titles),
              "sample": sample_stage, "server": server.rstrip("/"), "static": static,
              "staleMs": int(3 * KEEPALIVE * 1000)}  # a stream silent this long is dead: reconnect
    rid = esc(room.rec.request_id)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>TokenTrace classroom · {rid}</title>
<style>{css}{asset("classroom.css")}</style></head>
<body class="tt-class {'tt-presenter' if presenter else 'tt-follower'}">
<header><span class="tt-class-brand">TokenTrace classroom</span> · request <b>{rid}</b>
 · <span id="tt-class-role">{esc(role)}</span> · stage <b id="tt-class-pos">1</b> of {len(titles)}
 · <span id="tt-class-link">connecting…</span></header>
<nav id="tt-class-dots">{dots}</nav>
<section id="tt-class-q" hidden></section>
<main id="tt-class-stage"></main>
<footer>{nav}
{ask}</footer>
<script>const CONFIG = {script_json(config)};
{asset("classroom.js")}</script></body></html>"""
