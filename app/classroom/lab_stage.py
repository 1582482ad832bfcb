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
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from app.lab.export import cancelled_line, figures, headline_rows, sentences_in, title_in
from app.serving.recording import Recording
from visualizers import i18n
from visualizers.journey import Stage

PLOTLY_URL = "/lab/plotly.min.js"
FIGURE_HEIGHT = 450  # plotly's default, for a figure whose layout names none


def figures_frame(result: dict, elem_id: str = "tt-lab-figures", lang: str = i18n.DEFAULT) -> str:
    """The result's figures in one iframe (srcdoc: no file to serve, scripts allowed inside)."""
    figs = figures(result, lang)
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
    label = html.escape(i18n.gettext(lang, "the experiment's figures"), quote=True)
    return (f"<iframe id='{elem_id}' class='tt-lab-frame' title='{label}' "
            f"style='width:100%;height:{height}px;border:0' srcdoc=\"{html.escape(doc, quote=True)}\"></iframe>")


def result_html(result: dict, with_figures: bool = True, lang: str = i18n.DEFAULT) -> str:
    """Sentences, the headline table, then the figures, in `lang` (escaped: labels are data)."""
    e = html.escape
    header, rows = headline_rows(result, lang) if result["settings"] else ([], [])
    table = ("<table class='tt-lab-table'><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>"
             + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
             + "</table>") if rows else ""
    said = "".join(f"<p class='tt-lab-sentence'>{e(s)}</p>" for s in sentences_in(result, lang))
    if result.get("cancelled"):
        said += f"<p class='tt-lab-sentence'>{e(cancelled_line(result, lang))}</p>"
    about = i18n.gettext(lang, "{title} · model {model} · size {size} · {seconds} on this machine",
                         title=title_in(result, lang), model=result["model"], size=result["size"],
                         seconds=i18n.seconds(lang, result["seconds"]))
    return (f"<div class='tt-lab-result' lang='{i18n.TAGS.get(lang, 'en')}'><p class='tt-lab-about'>{e(about)}</p>"
            f"{said}{table}{figures_frame(result, lang=lang) if with_figures else ''}</div>")


def lab_stage(result: dict, lang: str = i18n.DEFAULT) -> Stage:
    return Stage("experiment", i18n.gettext(lang, "Experiment: {title}", title=title_in(result, lang)),
                 result_html(result, lang=lang), ())


@dataclass
class LabStage:
    """An experiment's result as a room's stage, drawn in each screen's language (a room calls it
    once per language and trace version); kept as its result (app/classroom/lasting.py)."""
    result: dict

    def __call__(self, lang: str) -> Stage:
        return lab_stage(self.result, lang)


def open_room(classrooms, result: dict, model: dict | None = None):
    """A room whose one stage is the result. model: the served model's facts (the presenter's
    layer and head pickers read them; the stage has no panel of the model's)."""
    facts = {"name": result["model"], "num_layers": 1, "num_heads": 1, **(model or {})}
    rec = Recording(f"experiment-{result['experiment']}", facts, None, [], [])
    return classrooms.create(rec, None, extra=[LabStage(result)], with_journey=False)


def add_to_room(classrooms, link: str, result: dict, lang: str = i18n.DEFAULT):
    """The result as a stage appended to a room the presenter already has open (after its
    journey's stages): link is the room's presenter link (/classroom/ID?key=KEY, or the whole
    URL). -> (room, the stage's index); ValueError says what is wrong with the link (in `lang`)."""
    parts = urlsplit((link or "").strip())
    path = [p for p in parts.path.split("/") if p]
    room_id = path[path.index("classroom") + 1] if "classroom" in path[:-1] else (path[-1] if len(path) == 1 else "")
    key = (parse_qs(parts.query).get("key") or [""])[0]
    if not room_id or not key:
        raise ValueError(i18n.gettext(lang, "paste the room's presenter link (it ends in ?key=…): only its presenter "
                                            "can add a stage"))
    room = classrooms.get(room_id)
    if room is None:
        raise ValueError(i18n.gettext(lang, "no open room {room} on this server (the oldest rooms close as new ones "
                                            "open)", room=repr(room_id)))
    if not hmac.compare_digest(key, room.key):
        raise ValueError(i18n.gettext(lang, "that key is not this room's presenter key: paste the presenter link, "
                                            "not the audience's"))
    index = room.add_stage(LabStage(result))
    # rendered now, off the engine's thread: followers only read the cache (as Classrooms.create does)
    threading.Thread(target=room.prerender, name=f"classroom-{room.room_id}", daemon=True).start()
    return room, index
