"""The page's Experiments tab: pick an experiment, a model and a size, Run; the
progress (which setting, what it is doing, a bar), Cancel, the generated sentences, the
headline table and the plotly figures (plotly.js from the installed package, served by this
server: no CDN), export as JSON or a self-contained HTML page, and open the result in the
classroom as a room of its own, or add it as a stage to a room the presenter already has open
(its presenter link). The same `app.lab.run` as `python -m app.lab`.

An experiment builds engines of its own (the served ones keep serving), so: one at a time in
this process (a second Run is told who runs), and off on a public server unless the operator
passes --lab."""
from __future__ import annotations

import html
import json
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Iterator

import gradio as gr
from fastapi import FastAPI
from fastapi.responses import Response

from app.classroom.lab_stage import add_to_room, open_room, result_html
from app.embedded import EMBEDDED_TARGET
from app.lab import Progress, experiments, run
from app.lab.export import plotly_js, to_html
from app.page.language import TRANSLATED, tx
from app.page.tabs import key_of, lang_of
from visualizers import i18n
from visualizers.i18n import N_
from visualizers.lab_words import word

EMBEDDED = N_("the embedded model")  # a picker's choice (shown in the tab's language, kept in English)
POLL_S = 0.3  # how often the progress is redrawn
KEEP_RESULTS = 16  # tabs whose last result is kept (for the classroom button)
_ONE_AT_A_TIME = threading.Lock()  # one experiment in this process: each loads engines of its own


@dataclass
class LabRun:
    owner: str  # the browser tab (Gradio session) that started it
    experiment: str
    title: str
    cancel: threading.Event = field(default_factory=threading.Event)
    progress: Progress | None = None
    result: dict | None = None
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)


class LabDesk:
    """Runs one experiment at a time off the request's thread, and keeps each tab's last result."""

    def __init__(self, enabled: bool, off_reason: str = "", model_facts: dict | None = None, classrooms=None,
                 public: bool = False, models: dict[str, str | None] | None = None) -> None:
        """models: what the model picker offers, by name -> the checkpoint an experiment loads
        (None: the embedded model); a name not offered is refused (no path comes from a browser)."""
        self.enabled, self.off_reason, self.public = enabled, off_reason, public
        self.model_facts, self.classrooms = model_facts, classrooms
        self.models = models if models is not None else {EMBEDDED: None}
        self.current: LabRun | None = None
        self.last: OrderedDict[str, dict] = OrderedDict()  # tab -> its last result (the newest KEEP_RESULTS)

    def start(self, owner: str, name: str, model: str, size: str) -> LabRun | str:
        """The run, or why not (off, another running, an unknown experiment or model), in the tab's language."""
        if not self.enabled:
            return tx(owner, self.off_reason)
        known = {e.name: e for e in experiments()}
        if name not in known:
            return tx(owner, "No experiment {name}: pick one of the list.", name=repr(str(name)[:40]))
        if model not in self.models:
            return tx(owner, "No model {name} here: pick one of the list.", name=repr(str(model)[:40]))
        if size not in ("ci", "full"):
            return tx(owner, "Pick a size: ci (seconds) or full (minutes).")
        if not _ONE_AT_A_TIME.acquire(blocking=False):
            busy = self.current
            who = tx(owner, " ({title}, started {seconds} s ago)", title=word(lang_of(owner), busy.title),
                     seconds=f"{time.monotonic() - busy.started:.0f}") if busy else ""
            return tx(owner, "Another experiment is running{who}: experiments build engines of their own, so this "
                             "server runs one at a time. Wait for it to end, or cancel it from the tab that started "
                             "it.", who=who)
        job = LabRun(owner, name, known[name].title)
        self.current = job
        threading.Thread(target=self._run, args=(job, self.models[model], size), name=f"lab-{name}",
                         daemon=True).start()
        return job

    def _run(self, job: LabRun, model: str | None, size: str) -> None:
        try:
            job.result = run(job.experiment, model=model, size=size, progress=lambda p: setattr(job, "progress", p),
                             cancelled=job.cancel.is_set).to_json()
            self.last[job.owner] = job.result
            self.last.move_to_end(job.owner)
            while len(self.last) > KEEP_RESULTS:
                self.last.popitem(last=False)
        except Exception as e:  # noqa: BLE001 - a bad model path or an engine error: said on the tab, not a crash
            job.error = (N_("the experiment failed; the server log has the details") if self.public
                         else f"the experiment failed: {e}")  # (an engine's own words stay as they are)
        finally:
            self.current = None
            _ONE_AT_A_TIME.release()
            job.done.set()

    def cancel(self, owner: str) -> str:
        job = self.current
        if job is None:
            return tx(owner, "Nothing is running.")
        if job.owner != owner:
            return tx(owner, "The experiment running was started from another tab: only that tab can cancel it.")
        job.cancel.set()
        return tx(owner, "Cancelling: the engines stop at their next step.")

    def open_in_classroom(self, owner: str) -> str:
        result, e = self.last.get(owner), html.escape
        if result is None or self.classrooms is None:
            return f"<div class='tt-err'>{e(tx(owner, FIRST))}</div>"
        room = open_room(self.classrooms, result, self.model_facts)
        title = f"<b>{e(word(lang_of(owner), result['title']))}</b>"
        presenter = (f"<a id='tt-lab-presenter' href='/classroom/{room.room_id}?key={room.key}' target='_blank'>"
                     f"{e(tx(owner, 'presenter view'))}</a>")
        audience = (f"<a id='tt-lab-audience' href='/classroom/{room.room_id}' target='_blank'>"
                    f"{e(tx(owner, 'audience link'))}</a>")
        return ("<div class='tt-class-links'>" + e(tx(owner, "Classroom for {title}: {lead} (keep this link to "
                                                              "yourself) · {audience}")).format(
            title=title, lead=presenter, audience=audience) + "</div>")

    def add_to_classroom(self, owner: str, link: str) -> str:
        """The last result as a stage appended to a room the presenter has open (its presenter link)."""
        result = self.last.get(owner)
        if result is None or self.classrooms is None:
            return f"<div class='tt-err'>{html.escape(tx(owner, FIRST))}</div>"
        try:
            room, index = add_to_room(self.classrooms, link, result, lang_of(owner))
        except ValueError as e:
            return f"<div class='tt-err' id='tt-lab-room-refused'>{html.escape(str(e))}</div>"
        said = html.escape(tx(owner, "{title} is stage {n} of room {room}: every screen of the room reloads its "
                                     "stages."))
        return ("<div class='tt-class-links' id='tt-lab-stage-added'>" + said.format(
            title=f"<b>{html.escape(word(lang_of(owner), result['title']))}</b>", n=index + 1,
            room=html.escape(room.room_id)) + "</div>")


def progress_html(job: LabRun, lang: str = i18n.DEFAULT) -> str:
    p, e = job.progress, html.escape
    title = word(lang, job.title)
    if p is None:
        return _bar(0.0, e(i18n.gettext(lang, "{title}: starting", title=title)))
    label, _, repeat = p.setting.partition(" · ")  # "· repeat 2 of 5" (runner.report)
    if repeat:
        repeat = " · " + i18n.gettext(lang, "repeat {n} of {count}", n=p.repeat + 1, count=p.repeats)
    head = e(i18n.gettext(lang, "{title} · setting {n} of {count}:", title=title, n=p.setting_index + 1,
                          count=p.num_settings))
    return _bar(p.fraction, f"{head} <b>{e(word(lang, label) + repeat)}</b> · {e(word(lang, p.what))}")


def _bar(fraction: float, what: str) -> str:
    pct = max(0.0, min(1.0, fraction)) * 100
    return (f"<div class='tt-lab-progress' data-fraction='{fraction:.3f}'><div class='tt-lab-what'>{what}</div>"
            f"<div class='tt-lab-bar' style='background:#e7e8ef;border-radius:4px;height:10px'>"
            f"<div style='width:{pct:.1f}%;background:#466ec8;height:10px;border-radius:4px'></div></div></div>")


def exports(result: dict, lang: str = i18n.DEFAULT) -> tuple[str, str]:
    """The result as JSON (English keys, as every result file) and as a self-contained HTML page
    (plotly.js inlined) in `lang`, in files."""
    folder = Path(tempfile.mkdtemp(prefix="tokentrace-lab-"))
    stem = f"{result['experiment']}-{result['size']}"
    (folder / f"{stem}.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    (folder / f"{stem}.html").write_text(to_html(result, lang), encoding="utf-8")
    return str(folder / f"{stem}.json"), str(folder / f"{stem}.html")


def watch(desk: LabDesk, key: str, name: str, model: str, size: str) -> Iterator[tuple]:
    """Run's handler: (progress, result, json file, html file) as the run goes."""
    job = desk.start(key, name, model, size)
    lang = lang_of(key)  # the tab's, when Run was pressed
    if isinstance(job, str):
        yield f"<div class='tt-err' id='tt-lab-refused'>{html.escape(job)}</div>", gr.update(), None, None
        return
    try:
        while not job.done.wait(POLL_S):
            yield progress_html(job, lang), gr.update(), None, None
        if job.error is not None:
            yield f"<div class='tt-err'>{html.escape(i18n.gettext(lang, job.error))}</div>", "", None, None
            return
        r = job.result
        done = (i18n.gettext(lang, "{title}: cancelled in {seconds}") if r["cancelled"] else
                i18n.gettext(lang, "{title}: done in {seconds}"))
        note = _bar(1.0 if not r["cancelled"] else (job.progress.fraction if job.progress else 0.0),
                    html.escape(done.format(title=word(lang, r["title"]), seconds=i18n.seconds(lang, r["seconds"]))))
        yield note, result_html(r, lang=lang), *exports(r, lang)
    finally:
        if not job.done.is_set():  # the tab went away mid-run: nobody will read it, free the engines
            job.cancel.set()


def build_lab_tab(ctl) -> LabDesk:
    """The tab's components and handlers, inside the page's gr.Tabs (layout.py)."""
    desk = lab_desk(ctl)
    choices = [(e.title, e.name) for e in experiments()]
    models = list(desk.models)
    with gr.Tab("Experiments", id="experiments", elem_id="tt-tab-lab"):
        # marked: the page's load and switch translate their text (language.TRANSLATED)
        gr.HTML("<div class='tt-lab-intro'>Each experiment runs a fixed, seeded workload on the real engine under "
                "two or more settings, one after another, and shows what the engine's own trace measured: "
                "side by side, with sentences generated from the numbers.</div>", elem_id="tt-lab-intro-box",
                elem_classes=[TRANSLATED])
        if not desk.enabled:
            gr.HTML(f"<div class='tt-err' id='tt-lab-off'>{html.escape(desk.off_reason)}</div>",
                    elem_id="tt-lab-off-box", elem_classes=[TRANSLATED])
        with gr.Row():
            pick = gr.Dropdown(choices, value=choices[0][1] if choices else None, label="Experiment",
                               elem_classes=[TRANSLATED], elem_id="tt-lab-exp", interactive=desk.enabled)
            model = gr.Dropdown([(m, m) for m in models], value=models[0],
                                label="Model (engines built for the experiment)",
                                elem_classes=[TRANSLATED], elem_id="tt-lab-model", interactive=desk.enabled)
            size = gr.Radio([(N_("ci: seconds"), "ci"), (N_("full: minutes"), "full")], value="ci", label="Size",
                            elem_classes=[TRANSLATED], elem_id="tt-lab-size", interactive=desk.enabled)
        with gr.Row():
            go = gr.Button("Run", variant="primary", elem_id="tt-lab-run", interactive=desk.enabled)
            stop = gr.Button("Cancel", elem_id="tt-lab-cancel", interactive=desk.enabled)
            to_class = gr.Button("Open in the classroom", elem_id="tt-lab-class", interactive=desk.enabled)
        with gr.Row():
            room_link = gr.Textbox(label="Or add the result as a stage to a room you present: its presenter link",
                                   placeholder="/classroom/…?key=…", elem_id="tt-lab-room-link", scale=4,
                                   interactive=desk.enabled)
            to_room = gr.Button("Add to that room", elem_id="tt-lab-add-stage", scale=1, interactive=desk.enabled)
        progress = gr.HTML("", elem_id="tt-lab-progress-box", padding=False)
        said = gr.HTML("", elem_id="tt-lab-said", padding=False)
        links = gr.HTML("", elem_id="tt-lab-class-links", padding=False)
        result = gr.HTML("", elem_id="tt-lab-result-box", padding=False)
        with gr.Row():
            as_json = gr.File(label="Result as JSON", elem_id="tt-lab-json", interactive=False)
            as_html = gr.File(label="Result as a self-contained HTML page", elem_id="tt-lab-html", interactive=False)

    def on_run(request: gr.Request, name, model_value, size_value):
        yield from watch(desk, key_of(request), name, model_value, size_value)

    quiet = {"api_visibility": "private", "show_progress": "hidden"}
    go.click(on_run, [pick, model, size], [progress, result, as_json, as_html], concurrency_limit=4, **quiet)
    def on_cancel(request: gr.Request) -> str:
        return f"<div class='tt-lab-note' id='tt-lab-cancelled'>{html.escape(desk.cancel(key_of(request)))}</div>"

    def on_classroom(request: gr.Request) -> str:
        return desk.open_in_classroom(key_of(request))

    def on_add_stage(request: gr.Request, link: str) -> str:
        return desk.add_to_classroom(key_of(request), link)

    stop.click(on_cancel, None, said, concurrency_limit=None, **quiet)
    to_room.click(on_add_stage, [room_link], links, concurrency_limit=None, **quiet)
    to_class.click(on_classroom, None, links, concurrency_limit=None, **quiet)
    return desk


FIRST = N_("Run an experiment first: its result is what the classroom shows.")


def lab_desk(ctl) -> LabDesk:
    """On unless the server is public without --lab; off on a replay server (no engine here)."""
    if not ctl.live:
        return LabDesk(False, N_("This server replays a recording and loads no model: run experiments on a server "
                                 "with a model (python -m app) or on the command line (python -m app.lab NAME)."))
    limits = ctl.models.limits
    on = not limits.public or getattr(limits, "lab", False)
    return LabDesk(on, N_("Experiments are off on this public server: each builds engines of its own. The "
                          "operator turns them on with --lab."), ctl.model, ctl.classrooms, limits.public, lab_models(ctl))


def lab_models(ctl) -> dict[str, str | None]:
    """The embedded model, and each served model by its served name -> its checkpoint."""
    out: dict[str, str | None] = {EMBEDDED: None}
    for s in ctl.models:
        path = Path(s.engine.model_path)
        if path.resolve() != EMBEDDED_TARGET.resolve():
            out.setdefault(s.model_name, str(path))
    return out


@cache
def _plotly() -> bytes:
    return plotly_js().encode()


def add_lab_routes(api: FastAPI) -> None:
    """plotly.js from the installed plotly package: the tab's and the classroom's figures load it."""
    @api.get("/lab/plotly.min.js")
    def plotly_file() -> Response:
        return Response(_plotly(), media_type="application/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})
