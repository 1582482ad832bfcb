"""The page's panels on a classroom's cut recording (app/classroom/mask.py), where the page's
own words would speak of a request still running: the answer "● streaming", the sampling
"no token sampled yet", no speculative round "yet". Each says instead what the class sees and
that the rest is hidden (the same clause as the stages' words, facts.said_hidden_rest), in the
screen's language."""
from __future__ import annotations

import visualizers as viz
from visualizers import i18n
from visualizers.choices import choices_html
from visualizers.i18n import N_, gettext

# the panels whose empty state would say "not yet", with what each hides
HIDES = {"sampling": (N_("Sampling"), N_("no draw is shown")),
         "logit_lens": (N_("Logit lens"), N_("no prediction is shown")),
         "spec": (N_("Speculative decoding"), N_("speculation is on for this request; no round is shown"))}


def hidden_clause(lang: str, note: dict) -> str:
    """What the class cannot see yet, as the stages' words say it (facts.said_hidden_rest)."""
    if note.get("asked"):
        return i18n.gettext(lang, "the answer from position {position} on is hidden until the reveal",
                            position=i18n.number(lang, int(note["position"])))
    return i18n.gettext(lang, "the answer is hidden until the presenter asks the class to predict it (or shows it)")


def cut_panel(view, name: str, note: dict | None, lang: str = i18n.DEFAULT) -> str | None:
    """The panel `name` of `view` (a LiveView fed the cut recording), or None where the page's
    own drawing is true of it. note: the cut's note (None: nothing is cut); lang: the screen's."""
    if note is None:
        return None
    rest = hidden_clause(lang, note)
    state = gettext(lang, "the request has ended") if note.get("ended") else \
        gettext(lang, "the request is still running")
    if name == "answer":
        shown = len(view.stream_tokens())
        what = i18n.ngettext(lang, "the class sees the first {n} token", "the class sees the first {n} tokens",
                             shown) if shown else gettext(lang, "the class sees none of the answer yet")
        said = gettext(lang, "{what}; {state}; {rest}", what=what, state=state, rest=rest)
        return viz.answer_html(view.stream_tokens(), None, view.error, "done", said, view.piece, lang=lang)
    if name == "choices" and view.n > 1:
        return choices_html(view.choice_outputs(), view.n, gettext(lang, "{state}; the rest is hidden", state=state),
                            lang=lang)
    if name == "spec" and view.has_input(name) and _drawn_with_the_hidden(view, note):
        sel = view.selection()
        return viz.spec_html(view.by_type["spec"], True, view.pieces(), selection=sel, hidden_round=True, lang=lang)
    if name in HIDES and not view.has_input(name):
        if name == "spec" and not (view.speculative and view.model.get("has_draft")):
            return None  # off for this request: the page's own words say so
        title, what = HIDES[name]
        return viz.not_recorded(gettext(lang, title),
                                gettext(lang, "{what}: {rest}", what=gettext(lang, what), rest=rest))
    return None


def _drawn_with_the_hidden(view, note: dict) -> bool:
    """Did the step that drew the hidden token also draw the token the selected pass predicted (a
    verify step keeps several drafts at once)? The cut left that step's round out."""
    sel = view.selection()
    gen = [o for o in view.outputs if o.get("token_id", -1) >= 0]
    i = None if sel.read is None else sel.read + 1 - sel.n_prompt
    if i is None or not 0 <= i < len(gen) or note.get("drawn_at") is None:
        return False
    return gen[i].get("step") == note["drawn_at"]
