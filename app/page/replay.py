"""A tab's recording replayed: one step (the slider), Play at a chosen speed, Pause, and a trace
file loaded."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import gradio as gr

from app.page import texts
from app.page.controls import Controls
from app.page.language import tx
from app.page.page_state import PageState
from app.page.step_bar import steps_of, steps_updates
from app.page.tabs import Tab, lang_of
from app.page.trace_files import write_timeline, write_trace
from app.page.updates import merged
from app.serving.recording import Recording, ReplayCursor, TraceFileError
from visualizers.i18n import gettext

# replay speed -> seconds per step (None: the recorded pace, which on a CPU is too fast to follow)
SPEEDS = {"1 step/s": 1.0, "2 steps/s": 0.5, "5 steps/s": 0.2, "10 steps/s": 0.1, "recorded pace": None}
MIN_FRAME = 0.1  # seconds a replay frame stays up at least (each is a full redraw)
MAX_FRAME = 2.0


class Replay(PageState):
    """The handlers of a tab's recording: a step, Play, Pause, a trace file loaded."""

    def show_frame(self, tab: Tab, frame: int, note: str = "") -> dict:
        """Every panel at one frame (0-based) of the tab's recording; Status and the slider both
        count engine steps from 1."""
        picked = tab.view.position if tab.view is not None else None
        view = tab.cursor.goto(frame)
        view.position = picked
        view.replaying = True
        tab.view = view
        state = gettext(tab.lang, "{request}: step {step} of {steps}", request=tab.cursor.rec.request_id,
                        step=tab.cursor.frame + 1, steps=steps_of(tab.cursor, tab.lang))
        return {**self.full(tab, view, state + note), "step": gr.update(value=tab.cursor.frame + 1),
                "step_box": gr.update(value=tab.cursor.frame + 1)}

    def goto(self, key: str, number, c: Controls) -> dict:
        """The slider or its number box moved: that step (a number out of range is clamped, and
        Status says so)."""
        tab = self.tab_of(key)
        if tab is None or tab.cursor is None:
            return {"status": tx(key, "nothing to replay yet: send a request or load a trace"),
                    **steps_updates(None, lang_of(key))}
        tab.cursor.view.layer, tab.cursor.view.head = int(c.layer or 0), int(c.head or 0)
        n = len(tab.cursor.steps)
        wanted, note = texts.clamp_step(number, n, lang_of(key))
        return merged(self.replaying(tab), self.show_frame(tab, wanted - 1, note))

    def replaying(self, tab: Tab) -> dict:
        """A recording replayed: the controls show its own request, read-only ("New request"
        makes them editable again, keeping those settings)."""
        if tab.locked or tab.cursor is None:
            return {}
        info = texts.with_defaults(tab.cursor.rec.model)
        return merged(self.settings_updates(tab.cursor.rec, info), self.lock(tab, True))

    def play(self, key: str, number, speed_name: str, c: Controls) -> Iterator[dict]:
        tab = self.tab_of(key)
        if tab is None or tab.cursor is None:
            yield {"status": tx(key, "nothing to replay yet: send a request or load a trace")}
            return
        cur = tab.cursor
        cur.view.layer, cur.view.head = int(c.layer or 0), int(c.head or 0)
        wanted, _ = texts.clamp_step(number, len(cur.steps))
        frame = wanted - 1
        first = 0 if frame >= cur.last_frame else max(0, frame)
        playing = tx(key, " · playing")
        yield merged(self.replaying(tab), self.show_frame(tab, first, playing), {"replay_note": ""})
        while cur.frame < cur.last_frame:
            pace = SPEEDS.get(speed_name, 0.5)
            time.sleep(min(MAX_FRAME, max(MIN_FRAME, cur.seconds_to_next() if pace is None else pace)))
            yield self.show_frame(tab, cur.frame + 1, playing if cur.frame + 1 < cur.last_frame else "")

    def paused(self, key: str) -> dict:
        tab = self.tab_of(key)
        if tab is None or tab.cursor is None or tab.cursor.frame < 0:
            return {}
        cur = tab.cursor
        return {"status": tx(key, "{request}: paused at step {step} of {steps}", request=cur.rec.request_id,
                             step=cur.frame + 1, steps=steps_of(cur, lang_of(key)))}

    def load_trace(self, key: str, path: str) -> dict:
        """A trace file loaded: its last step, the controls set to its request (read-only)."""
        try:
            rec = Recording.loads(Path(path).read_bytes())
        except (TraceFileError, OSError) as e:
            return {"status": tx(key, "cannot load the trace: {reason}", reason=e)}
        self.sessions.watching.discard(key)
        tab = Tab(rec.new_view(), ReplayCursor(rec), locked=True)
        self.sessions.put(key, tab)
        out = self.show_frame(tab, tab.cursor.last_frame, tx(key, " · loaded {name}", name=Path(path).name))
        # the trace's own model draws the selectors (from layer 0); a served one takes the picker too
        info = texts.with_defaults(rec.model)
        controls = self.controls_for(info, served_model=info["name"] in self.infos, lang=lang_of(key))
        return merged(out, controls, self.settings_updates(rec, info), self.lock(tab, True),
                      {"export": gr.update(value=write_trace(rec), interactive=True),
                       **steps_updates(tab.cursor, lang_of(key)),
                       "export_timeline": gr.update(value=write_timeline(rec), interactive=bool(rec.events))})
