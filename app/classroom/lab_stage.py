"""An experiment's result (app/lab) as a classroom stage of its own: its generated sentences,
its headline table and its plotly figures, on the projector and every follower's screen.

The figures are drawn in an iframe whose page loads plotly.js from this server
(/lab/plotly.min.js: the installed plotly package's own file, no CDN), so the page and the
classroom draw the same figures offline. Every string is escaped; the figures' JSON cannot
end its script early."""
from __future__ import annotations

import hmac
import html
import json
import threading
from urllib.parse import parse_qs, urlsplit

from app.lab.export import figures, headline_rows
from app.serving.recording import Recording
from visualizers.journey import Stage

PLOTLY_URL = "/lab/plotly.min.js"
FIGURE_HEIGHT = 450  # plotly's default, for a figure whose layout names none


def figures_frame(result: dict, elem_id: str = "tt-lab-figures") -> str:
    """The result's figures in one iframe (srcdoc: no file to serve, scripts allowed inside)."""
    figs = figures(result)
    if not figs:
        return ""
    data = json.dumps(figs).replace("</", "<\\/")
    height = sum(int(f["layout"].get("height") or FIGURE_HEIGHT) + 16 for f in figs) + 16
    doc = (f"<!doctype html><html><head><meta charset='utf-8'><script src='{PLOTLY_URL}'></script>"
           "<style>body{margin:0;font-family:system-ui,sans-serif}.fig{margin:0 0 16px}</style></head><body>"
           + "".join(f"<div class='fig' id='fig{i}'></div>" for i in range(len(figs)))
           + f"<script>const FIGS = {data};"
           "FIGS.forEach((f, i) => Plotly.newPlot('fig' + i, f.data, f.layout,"
           " {responsive: true, displaylogo: false}));"
           "document.body.dataset.drawn = String(FIGS.length);</script></body></html>")
    return (f"<iframe id='{elem_id}' class='tt-lab-frame' title='the experiment&#x27;s figures' "
            f"style='width:100%;height:{height}px;border:0' srcdoc=\"{html.escape(doc, quote=True)}\"></iframe>")


def result_html(result: dict, with_figures: bool = True) -> str:
    """Sentences, the headline table, then the figures (escaped: labels are data)."""
    e = html.escape
    header, rows = headline_rows(result) if result["settings"] else ([], [])
    table = ("<table class='tt-lab-table'><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>"
             + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
             + "</table>") if rows else ""
    said = "".join(f"<p class='tt-lab-sentence'>{e(s)}</p>" for s in result.get("sentences") or [])
    if result.get("cancelled"):
        said += (f"<p class='tt-lab-sentence'>Cancelled after {len(result['settings'])} setting(s): the numbers "
                 "below are those settings' only; no comparison is drawn.</p>")
    about = (f"{result['title']} · model {result['model']} · size {result['size']} · {result['seconds']:.1f} s "
             f"on this machine")
    return (f"<div class='tt-lab-result'><p class='tt-lab-about'>{e(about)}</p>{said}{table}"
            f"{figures_frame(result) if with_figures else ''}</div>")


def lab_stage(result: dict) -> Stage:
    return Stage("experiment", f"Experiment: {result['title']}", result_html(result), ())


def open_room(classrooms, result: dict, model: dict | None = None):
    """A room whose one stage is the result. model: the served model's facts (the presenter's
    layer and head pickers read them; the stage has no panel of the model's)."""
    facts = {"name": result["model"], "num_layers": 1, "num_heads": 1, **(model or {})}
    rec = Recording(f"experiment-{result['experiment']}", facts, None, [], [])
    return classrooms.create(rec, None, extra=[lab_stage(result)], with_journey=False)


def add_to_room(classrooms, link: str, result: dict):
    """The result as a stage appended to a room the presenter already has open (after its
    journey's stages): link is the room's presenter link (/classroom/ID?key=KEY, or the whole
    URL). -> (room, the stage's index); ValueError says what is wrong with the link."""
    parts = urlsplit((link or "").strip())
    path = [p for p in parts.path.split("/") if p]
    room_id = path[path.index("classroom") + 1] if "classroom" in path[:-1] else (path[-1] if len(path) == 1 else "")
    key = (parse_qs(parts.query).get("key") or [""])[0]
    if not room_id or not key:
        raise ValueError("paste the room's presenter link (it ends in ?key=…): only its presenter can add a stage")
    room = classrooms.get(room_id)
    if room is None:
        raise ValueError(f"no open room {room_id!r} on this server (the oldest rooms close as new ones open)")
    if not hmac.compare_digest(key, room.key):
        raise ValueError("that key is not this room's presenter key: paste the presenter link, not the audience's")
    index = room.add_stage(lab_stage(result))
    # rendered now, off the engine's thread: followers only read the cache (as Classrooms.create does)
    threading.Thread(target=room.prerender, name=f"classroom-{room.room_id}", daemon=True).start()
    return room, index
