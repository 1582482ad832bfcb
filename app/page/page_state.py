"""The page's state over every tab (the models, their facts, the sessions, the blank view) and the
updates every handler sends: the views, the journey, the controls' lock, the recording."""
from __future__ import annotations

import time
from dataclasses import replace

import gradio as gr

from app.classroom.rooms import Classrooms
from app.page import texts
from app.page.code_panel import code_views, with_code
from app.page.controls import LOCKED, MORE, Controls, more_fields, parse_seed
from app.page.live_view import PANELS, LiveView
from app.page.stages import JourneyClock
from app.page.step_bar import first_bar, steps_updates, which_steps
from app.page.tabs import Sessions, Tab, lang_of
from app.page.trace_files import write_timeline, write_trace
from app.serving.engine_service import EngineService
from app.serving.recording import Recording, ReplayCursor, record_request
from app.serving.requests import BodyError, build_body
from app.serving.served_models import ServedModels
from visualizers.i18n import gettext
from visualizers.journey import journey

TOO_FAST = 2.0  # an answer streamed in less than this (seconds) was too fast to watch: offer Play


def stages_of(view: LiveView, lang: str = "en") -> list:
    """The journey of the request a view shows (the pipeline map and the stages' sentences)."""
    # the words speak of the pass the panels show now (their last draw), not of a newer one
    position = view.shown_read if view.shown_read is not None else view.position
    with view.lock:  # (a click's journey beside the stream's: one fold of its events at a time)
        stages = journey(view.model, view.request_id or "", view.body or None, view.events, view.outputs,
                         truncated=view.first("trace.truncated"), position=position, layer=view.layer,
                         trail=view.trail(), lang=lang)  # layer: the picker's (the MoE routing the words quote)
        return with_code(stages, view.model, view.events, view.request_id or "", position, view.layer, lang)


class PageState:
    """The tabs' state, and what every handler sends. served: the models Send may go to (None: a
    replay-only page showing `replay`)."""

    def __init__(self, served: ServedModels | EngineService | None, replay: Recording | None = None,
                 classrooms: Classrooms | None = None) -> None:
        self.models = ServedModels.of(served) if served is not None else None
        self.live = self.models is not None
        self.replay = replay
        self.infos = {s.model_name: texts.with_defaults(s.model_info()) for s in self.models} if self.live else {}
        self.model = self.infos[self.models.first.model_name] if self.live else texts.with_defaults(replay.model)
        self.sessions = Sessions()
        self.classrooms = classrooms or Classrooms()
        self.cap = self.cap_of(self.model)  # the first model's: the slider the page opens with
        # the controls when the page opens (the Request panel's first body is built from them too)
        self.opening = Controls(max_tokens=min(Controls.max_tokens, self.cap), model=self.model["name"],
                                speculative=self.model["has_draft"], k=self.model["num_speculative_tokens"])
        if self.live:
            self.blank, self.first_frames = self.blank_view(self.models.first), 0
        else:
            first = ReplayCursor(replay)
            self.blank, self.first_frames = first.goto(first.last_frame), first.last_frame + 1

    def cap_of(self, info: dict) -> int:
        """The max-tokens slider's end for a model: the limit the API applies (the server's cap,
        else the model's context less a one-token prompt; Send refuses what this prompt leaves no
        room for, as the API refuses a max_tokens the context cannot hold)."""
        context = int(info.get("max_model_len") or 0) - 1
        cap = self.models.limits.max_tokens_cap if self.live else None
        return max(1, min(cap or context, context) if context > 0 else cap or 512)

    # --- views ------------------------------------------------------------------------------
    def service_of(self, name: str | None) -> EngineService:
        return self.models.by_name.get(name) or self.models.first

    def new_view(self, service: EngineService) -> LiveView:
        return LiveView(model=self.infos[service.model_name], piece=service.piece, is_special=service.is_special)

    def body_of(self, info: dict, c: Controls) -> dict:
        """The controls as the body Send posts to the model `info` (a seed that is not an
        integer stays as typed: Send refuses it, under the seed box)."""
        try:
            seed_value = parse_seed(c.seed)
        except BodyError:
            seed_value = c.seed
        body = build_body(info["name"], c.system or "", c.user or "", float(c.temperature), int(c.top_k or 0),
                          float(c.top_p), int(c.max_tokens or 1), seed_value, bool(c.speculative) and info["has_draft"],
                          int(c.k or 1), c.level, plain=not info["chat_template"])  # a base model: a plain prompt
        return {**body, **more_fields(c)}

    def blank_view(self, service: EngineService, controls: Controls | None = None) -> LiveView:
        """Before any request: the model's empty panels, its KV pool as it is now, and the body
        Send would post with the controls as they are (the opening ones when not given)."""
        info = self.infos[service.model_name]
        view = self.new_view(service)
        c = controls or Controls(**{**self.opening.as_dict(), "speculative": info["has_draft"],
                                    "k": info["num_speculative_tokens"]})
        view.body = self.body_of(info, c)
        view.set_pool(service.pool())
        return view

    def tab_of(self, key: str) -> Tab | None:
        tab = self.sessions.get(key)
        if tab is None and self.replay is not None:  # a fresh tab on a replay server starts on the file
            cursor = ReplayCursor(self.replay)
            tab = Tab(view=cursor.goto(cursor.last_frame), cursor=cursor, locked=True)
            self.sessions.put(key, tab)
        return tab

    def view_of(self, key: str) -> LiveView:
        tab = self.tab_of(key)
        return tab.view if tab is not None else self.blank

    # --- what a handler sends -----------------------------------------------------------------
    def journey_updates(self, tab: Tab | None, view: LiveView, now: float, force: bool = False,
                        lang: str | None = None) -> dict:
        """The pipeline map and the stages' sentences (only what changed since the last time), in the
        tab's language (lang: another's, for a tab not yet kept)."""
        clock = tab.clock if tab is not None else JourneyClock()
        lang = lang or (tab.lang if tab is not None else "en")
        out = clock.updates(stages_of(view, lang), now, live=view.request_id is not None, force=force, lang=lang)
        return {n: (gr.update(visible=v) if n.startswith("section:") else v) for n, v in out.items()}

    def full(self, tab: Tab | None, view: LiveView, state: str) -> dict:
        """Every panel, the journey and Status."""
        now = time.perf_counter()
        return {**view.draw(list(PANELS), now), **self.journey_updates(tab, view, now), "status": state}

    def opening_page(self, key: str, panels: bool = False) -> dict:
        """What a tab shows when it (re)loads: the journey of what it shows; panels: its panels
        too, in its language (a load in another language than the page's English, the switch)."""
        tab, lang, now = self.tab_of(key), lang_of(key), time.perf_counter()
        view = tab.view if tab is not None else replace(self.blank, lang=lang)  # (the blank is every tab's)
        view.lang = lang
        with view.lock:  # drawn, not kept: the stream's own redraws go on as they were
            drawn = {n: view.render(n) for n in PANELS} if panels else {}
        return {**drawn, **self.journey_updates(None, view, now, force=True, lang=lang)}

    def page_words(self, key: str) -> dict:
        """The words around the controls that are not plain labels, in the tab's language (its
        load in Chinese, the switch): the model's summary and note, the max-tokens and
        speculation labels, the replay bar's label and note. Only words: no value changes."""
        tab, lang = self.tab_of(key), lang_of(key)
        loaded = tab is not None and tab.cursor is not None and tab.service is None  # a trace file
        info = texts.with_defaults(tab.cursor.rec.model) if loaded else self.infos.get(self.shown_model(tab), self.model)
        bar, note = first_bar(tab.cursor if tab is not None else None, lang)
        out = {"summary": texts.model_summary(info, lang), "step": gr.update(label=bar["label"]), "step_note": note,
               **{f"code:{k}": view for k, view in code_views(lang).items()}}  # the code views' closed lines
        if self.live and info["name"] in self.infos:
            out.update({"note": texts.model_note(info, len(self.infos), lang),
                        "max_tokens": gr.update(label=texts.max_label(self.cap_of(info), info.get("max_model_len"),
                                                                      lang)),
                        "speculative": gr.update(label=gettext(lang, "Speculative decoding"),
                                                 info=texts.spec_info(info, lang))})
        return out

    def lock(self, tab: Tab | None, locked: bool) -> dict:
        """The controls read-only (a replayed or watched request shown) or editable again."""
        if tab is not None:
            tab.locked = locked
        interactive = self.live and not locked
        out = {n: gr.update(interactive=interactive) for n in LOCKED if n not in ("system", "speculative", "k")}
        info = self.infos.get(self.shown_model(tab), self.model)
        out["system"] = gr.update(interactive=interactive and info["chat_template"])  # a base model has none
        out["speculative"] = gr.update(interactive=interactive and info["has_draft"])
        out["k"] = gr.update(interactive=interactive and info["has_draft"])
        out["send"] = gr.update(interactive=interactive)
        out["unlock"] = gr.update(visible=bool(locked and self.live))
        return out

    def shown_model(self, tab: Tab | None) -> str:
        if tab is not None and tab.service is not None:
            return tab.service.model_name
        return self.model["name"]

    def stop_look(self, running: bool, can_stop: bool | None = None) -> dict:
        """Stop is red only while something runs that it would stop, and pressable only while
        there is something to stop (can_stop: a watch between requests, which Stop ends)."""
        return {"stop": gr.update(variant="stop" if running else "secondary",
                                  interactive=running if can_stop is None else can_stop)}

    def controls_for(self, info: dict, served_model: bool = True, lang: str = "en") -> dict:
        """Updates for every control and panel frame that depends on the model shown: the picker
        and Send's controls too when it is one of the served models (not a loaded trace); their
        words in `lang`."""
        out = {"summary": texts.model_summary(info, lang), "moe_col": gr.update(visible=info["is_moe"]),
               "layer": gr.update(choices=list(range(info["num_layers"])), value=0),
               "head": gr.update(choices=list(range(info["num_heads"])), value=0)}
        if served_model:
            plain = not info["chat_template"]
            out.update({"model_pick": gr.update(value=info["name"]), "note": texts.model_note(info, len(self.infos), lang),
                        "system": gr.update(label=texts.SYSTEM_LABEL[plain], interactive=not plain),
                        "user": gr.update(label=texts.USER_LABEL[plain]),
                        "max_tokens": gr.update(maximum=self.cap_of(info),
                                                label=texts.max_label(self.cap_of(info), info.get("max_model_len"),
                                                                      lang)),
                        "speculative": gr.update(value=info["has_draft"], interactive=info["has_draft"],
                                                 info=texts.spec_info(info, lang)),
                        "k": gr.update(maximum=max(1, info["num_speculative_tokens"]),
                                       value=info["num_speculative_tokens"], interactive=info["has_draft"],
                                       visible=info["has_draft"])})
        return out

    def settings_updates(self, rec: Recording, info: dict) -> dict:
        """The controls set to a recorded request's own settings: prompts, sampling, speculation,
        capture level."""
        got = texts.trace_settings(rec, info)
        return self.settings_of(got, info)

    def settings_of(self, got: dict, info: dict) -> dict:
        out = {n: got[n] for n in ("system", "user", "temperature", "top_k", "top_p", "seed", "level")}
        neutral = Controls()  # a body that cannot be read says nothing of them: the neutral knobs, not the last ones
        out.update({n: got.get(n, getattr(neutral, n)) for n in MORE})
        out["max_tokens"] = gr.update(value=min(got["max_tokens"], self.cap_of(info)))
        if info["name"] in self.infos:  # a served model: its draft decides whether speculation can be on
            out["speculative"] = gr.update(value=got["speculative"] and info["has_draft"])
            out["k"] = gr.update(value=max(1, min(got["k"], info["num_speculative_tokens"])))
        else:  # not served here: the controls still say what the trace's request used
            out["speculative"] = gr.update(value=got["speculative"])
            out["k"] = gr.update(value=max(1, got["k"]), maximum=max(1, got["k"]), visible=bool(got["speculative"]))
        return out

    def no_recording(self, lang: str = "en") -> dict:
        return {"export": gr.update(value=None, interactive=False), **steps_updates(None, lang),
                "export_timeline": gr.update(value=None, interactive=False), "replay_note": ""}

    def recording_updates(self, tab: Tab) -> dict:
        """A finished live request as a recording: Export and the step slider (at capture level
        off, what the page itself received: the streamed tokens and the usage). The heavy part of
        a finish (the whole trace read and written as JSON): after the final panels are out."""
        view, svc = tab.view, tab.service
        info = self.infos[svc.model_name]
        rec = record_request(svc.store, view.request_id, info, svc.piece, svc.is_special) \
            if view.request_id else None
        if rec is None and view.request_id and view.outputs and view.level == "off":
            ids = set(view.generated_ids())
            rec = Recording(view.request_id, info, view.body or None, [], list(view.outputs),
                            {i: svc.piece(i) for i in ids}, {i for i in ids if svc.is_special(i)},
                            choices=[outs for outs in view.choice_outputs()[1:]])  # level off: what the page got
        if rec is None:
            return self.no_recording(tab.lang)
        tab.cursor = ReplayCursor(rec)
        tab.cursor.adopt(view)  # the live view already shows the last frame
        return {"export": gr.update(value=write_trace(rec), interactive=True), **steps_updates(tab.cursor, tab.lang),
                "export_timeline": gr.update(value=write_timeline(rec), interactive=bool(rec.events)),
                "replay_note": texts.too_fast_note(view.stream_tokens(), len(tab.cursor.steps), TOO_FAST,
                                                   which_steps(tab.cursor, tab.lang), tab.lang)}
