"""A classroom as a static bundle, for a hall larger than one small server holds.

The zip holds the audience page (index.html), every stage's rendered HTML (stages/N.json,
the same bytes the server serves, with the question's token hidden as it is now; and
stages/revealed/N.json, with it shown: the page takes those once the server says it is revealed)
and the trace (trace.json). Any static host serves it
(a CDN, `python -m http.server`); the page takes only the presenter's position (and the
question) from this server's event stream, which is a few hundred bytes per move.
"""
from __future__ import annotations

import io
import zipfile
from dataclasses import replace

from app.classroom.page import page_html
from app.page.code_panel import code_body, code_views
from visualizers import i18n

README = """TokenTrace classroom {room}: request {request_id}

Serve this folder from any static web server, e.g.
    python -m http.server 8000
and give the students http://<host>:8000/index.html . The page shows the stages from
these files and follows the presenter's position from {server} (which must stay up);
votes on the live question go to that server too.
trace.json is the request's trace: `python -m app --replay trace.json` replays it.
"""


def bundle_zip(room, server: str, css: str, lang: str = i18n.DEFAULT) -> bytes:
    """room: a finished Room (app.classroom.rooms); server: the origin the page follows; lang: the
    bundle's language (the presenter's, who downloads it: a static page has no server to ask)."""
    room.prerender(lang)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("index.html", page_html(room, False, css, server=server, static=True, lang=lang))
        # the same room, nothing hidden
        shown = replace(room, revealed=True, _stages=[], _tongues={}, _html={}, langs={i18n.DEFAULT})
        for i in range(len(room.stage_list(lang))):
            z.writestr(f"stages/{i}.json", room.stage_body(i, lang))
            z.writestr(f"stages/revealed/{i}.json", shown.stage_body(i, lang))
        for key in code_views():  # each stage's code view, fetched when the presenter opens it (classroom.js)
            z.writestr(f"code/{key}.html", code_body(key, lang))
        z.writestr("trace.json", room.rec.dumps())
        z.writestr("README.txt", README.format(room=room.room_id, request_id=room.rec.request_id, server=server))
    return buf.getvalue()

