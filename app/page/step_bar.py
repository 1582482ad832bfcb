"""The replay bar's step slider, its number box, and the line shown instead of them when
there is nothing to scrub.

A Gradio slider needs minimum < maximum, so a request of one engine step (or of none: stopped
before the scheduler ran it) drew a 0..1 slider labelled "engine step 1..1", and the idle page
a 0..1 slider over nothing. There the slider and its box are hidden and one sentence says what
there is (screens-defects 9 and 17)."""
from __future__ import annotations

import gradio as gr

from app.page import texts
from app.serving.recording import AFTER_STEPS, BEFORE_STEPS, ReplayCursor
from visualizers.i18n import gettext, ngettext


def which_steps(cursor: ReplayCursor, lang: str = "en") -> str:
    """What a recording's steps are, said where not every step was recorded: at capture level
    off its frames are the engine steps that drew a token (the timeline says how many)."""
    return "" if cursor.rec.events else gettext(lang, " that drew a token")


def steps_of(cursor: ReplayCursor, lang: str = "en") -> str:
    """"7 engine steps", as Status, the slider and the timeline all count them."""
    return ngettext(lang, "{n} engine step", "{n} engine steps", len(cursor.steps)) + which_steps(cursor, lang)


def never_ran(cursor: ReplayCursor) -> bool:
    """Ended before any engine step ran it (aborted while waiting): its one frame is its end."""
    rec = cursor.rec
    outs = rec.outputs + [o for c in rec.choices for o in c]
    return not any(o.get("token_id", -1) >= 0 for o in outs) and \
        all(e["type"] in BEFORE_STEPS + AFTER_STEPS + ("kv.pool",) for e in rec.events)


def step_range(frames: int, frame: int, which: str = "", lang: str = "en") -> dict:
    """The step slider over `frames` engine steps at 0-based `frame`: the values are 1..frames,
    as Status counts them; hidden under two frames (nothing to scrub: step_note says so)."""
    label = texts.step_label(frames, which, lang)
    if frames <= 1:
        return {"minimum": 0, "maximum": 1, "value": 1 if frames else 0, "interactive": False, "label": label,
                "visible": False}
    return {"minimum": 1, "maximum": frames, "value": frame + 1, "interactive": True, "label": label,
            "visible": True}


def first_bar(cursor: ReplayCursor | None, lang: str = "en") -> tuple[dict, str]:
    """The slider's keyword arguments and the note's HTML when the page is built (lang: its words')."""
    if cursor is None:
        return step_range(0, -1, lang=lang), texts.step_note(0, lang=lang)
    frames, which = cursor.last_frame + 1, which_steps(cursor, lang)
    return step_range(frames, cursor.last_frame, which, lang), texts.step_note(frames, never_ran(cursor), which, lang)


def steps_updates(cursor: ReplayCursor | None, lang: str = "en") -> dict:
    """The step slider, its number box, the note and Play / Pause over a recording (None:
    nothing to replay: Play and Pause off, as the slider is), in the tab's language."""
    r, note = first_bar(cursor, lang)
    if cursor is not None:
        r["value"] = cursor.frame + 1 if r["visible"] else r["value"]
    playable = gr.update(interactive=r["visible"])
    return {"play": playable, "pause": playable, "step": gr.update(**r), "step_box": gr.update(value=r["value"], interactive=r["interactive"],
                                                          visible=r["visible"]),
            "step_note": gr.update(value=note, visible=not r["visible"])}
