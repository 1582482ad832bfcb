"""The classroom's page (presenter, follower, or a static bundle's index.html): page.html (and,
for the presenter, presenter.html's controls) filled with escaped values, around classroom.js
and classroom.css: each a file of its own, read, linted and cached as what it is. The room's
settings reach the script as CONFIG."""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from string import Template
from typing import Protocol

from app.classroom.push import KEEPALIVE
from app.classroom.words import fill, script_text, switch_html
from app.serving.recording import Recording
from visualizers import i18n
from visualizers._html import esc
from visualizers.journey import Stage

HERE = Path(__file__).parent


@cache
def asset(name: str) -> str:
    return (HERE / name).read_text()


class Room(Protocol):
    """What the page reads of a room (app/classroom/rooms.py's Room)."""
    room_id: str
    key: str
    rec: Recording
    skipped: list[str]  # the titles of the stages this request skips

    def stage_list(self, lang: str = ...) -> list[Stage]: ...

    def skipped_in(self, lang: str) -> list[str]: ...


def script_json(value: object) -> str:
    """JSON safe inside <script>: no "</script>" can end it early."""
    return json.dumps(value).replace("</", "<\\/")


def page_html(room: Room, presenter: bool, css: str, server: str = "", static: bool = False,
              lang: str = i18n.DEFAULT) -> str:
    """server: the origin the page follows (empty: its own); static: a bundle's page, which
    reads the stages from its own files (stages/N.json) and only the position from the server;
    lang: this screen's language (its words and its stages')."""
    titles = [s.title for s in room.stage_list(lang)]
    # the stages this request skips, as one line (the page's map lists them so: app/page/stages.py)
    said = esc(i18n.gettext(lang, "skipped by this request: {stages}")).format(stages=esc(" · ".join(room.skipped_in(lang))))
    skip = f"<div class='tt-map-skipped tt-class-skipped'>{said}</div>" if room.skipped else ""
    dots = "".join(f"<button class='tt-class-dot' data-i='{i}' title='{esc(t)}'>{i + 1}</button>"
                   for i, t in enumerate(titles))
    role = (i18n.gettext(lang, "presenter: → / ← / space / PageDown move the whole class") if presenter else
            i18n.gettext(lang, "following the presenter"))
    m = room.rec.model
    controls = (Template(fill(asset("presenter.html"), lang)).substitute(
        max_layer=int(m["num_layers"]) - 1, max_head=int(m["num_heads"]) - 1) if presenter else "")
    sample = next((i for i, s in enumerate(room.stage_list(lang)) if s.key == "sampling"), -1)
    config = {"room": room.room_id, "key": room.key if presenter else "", "count": len(titles),
              "sample": sample,  # where a question fits best (benchmarks/hall_load.py asks there)
              "server": server.rstrip("/"), "static": static,
              "staleMs": int(3 * KEEPALIVE * 1000),  # a stream silent this long is dead: reconnect
              "text": script_text(lang), "langCookie": i18n.COOKIE,
              "lang": i18n.TAGS.get(lang, "en")}  # the stages are fetched in this screen's language
    return Template(fill(asset("page.html"), lang)).substitute(
        html_lang=i18n.TAGS.get(lang, "en"), lang_switch="" if static else switch_html(lang),
        rid=esc(room.rec.request_id), css=css + asset("classroom.css"),
        role_class="tt-presenter" if presenter else "tt-follower", role=esc(role), count=len(titles), dots=dots + skip,
        presenter=controls, config=script_json(config), script=asset("classroom.js"))
