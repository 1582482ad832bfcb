"""The page's controller: every handler of the page, as methods of one object over each
browser tab's state, testable without a browser.

A handler takes the tab's key (Gradio's session hash) and the controls by name (`Controls`),
and returns {output name: value or gr.update(...)}; the page's layout maps the names to its
components (and keeps the page's API outputs in their published order). Names: the panels
(live_view.PANELS), "status", "export", "export_timeline", "step", the hint boxes, the
controls, "map", "stage:KEY" (a stage's sentence), "section:KEY" (a stage's section shown).

Send runs a generator in a worker thread: it submits the request to the engine service and
yields only the panels whose inputs changed, every YIELD_EVERY seconds at most, as HTML
(gr.Plot streaming falls behind and leaks browser memory; HTML does not); the pipeline map
and the stages' sentences follow every JOURNEY_EVERY seconds. Watch follows requests sent by others (curl,
the SDK, other tabs) the same way. A finished request becomes a recording: export it, load
one, scrub or play it step by step, or open it in classroom mode.

The handlers by job: page_state (the tabs' state and the updates every handler sends),
streaming (Send, Watch, Stop), replay (a recording's steps, Play, a trace loaded), and here the
pickers, a token click, "New request", the preview and the classroom button."""
from __future__ import annotations

import time

import gradio as gr

import visualizers as viz
from app.page.controls import Controls, more_fields  # noqa: F401 - more_fields: read from here by tests
from app.page.language import tx
from app.page.live_view import ONE_PASS
from app.page.page_state import stages_of  # noqa: F401 - read from here by tests
from app.page.replay import Replay
from app.page.streaming import Streaming
from app.page.tabs import Tab, lang_of
from app.page.updates import merged
from app.serving.recording import record_request


class Controller(Streaming, Replay):
    """Every handler of the page, over the tabs' state. served: the models Send may go to
    (None: a replay-only page showing `replay`)."""

    # --- the model picker, the pickers, a token click ----------------------------------------------
    def pick_model(self, key: str, c: Controls) -> dict:
        """The picker moved: Send's controls, the selectors and every panel follow that model
        (a request still streaming in this tab keeps its panels until it ends)."""
        self.sessions.watching.discard(key)  # picking ends watching
        service = self.service_of(c.model)
        info = self.infos[service.model_name]
        out = self.controls_for(info, lang=lang_of(key))
        del out["model_pick"]  # the user's own move
        out["max_tokens"]["value"] = min(int(c.max_tokens or 1), self.cap_of(info))  # within the new model's limit
        tab = self.sessions.get(key)
        if tab is not None and not tab.watched and tab.view.request_id and not tab.view.finished:
            return {n: v for n, v in out.items() if n not in ("summary", "moe_col", "layer", "head")}
        mine = Controls(**{**c.as_dict(), "speculative": info["has_draft"], "k": info["num_speculative_tokens"]})
        tab = Tab(self.blank_view(service, mine), service=service)
        self.sessions.put(key, tab)
        ready = tx(key, "{model}: Send goes to this model", model=info["name"]) if info["chat_template"] else \
            tx(key, "{model}: Send goes to this model (plain-prompt mode: no chat template)", model=info["name"])
        return merged(self.full(tab, tab.view, ready), self.lock(tab, False), out, self.no_recording(lang_of(key)),
                      self.stop_look(False))

    def redraw(self, key: str, c: Controls) -> dict:
        """The layer or head picker moved: attention and MoE at that layer and head."""
        view = self.view_of(key)
        select_head = getattr(view, "select_head", None)  # the one selection (live_view), where it exists
        if select_head is not None:
            select_head(int(c.layer or 0), int(c.head or 0))
        else:
            view.layer, view.head = int(c.layer or 0), int(c.head or 0)
        return {"attention": view.render("attention"), "moe": view.render("moe"),  # the layers words quote it too
                **self.journey_updates(self.sessions.get(key), view, time.perf_counter())}

    SELECTED = ONE_PASS  # what one token click redraws: every panel that names a pass (the stages' words too)

    def pick_token(self, key: str, value: str, c: Controls) -> dict:
        """A token chip was clicked ("POSITION:NONCE"): every panel shows that position's pass."""
        tab = self.sessions.get(key) or (self.tab_of(key) if self.replay is not None else None)
        if tab is None:  # nothing shown yet (the blank view is every tab's: not to be changed)
            return {}
        view = tab.view
        try:
            position = int(str(value).split(":")[0])
        except ValueError:
            position = None
        select = getattr(view, "select", None)
        if select is not None:
            select(position)
        else:
            view.position = position
        view.layer, view.head = int(c.layer or 0), int(c.head or 0)
        now = time.perf_counter()
        return {**view.draw(list(self.SELECTED), now), **self.journey_updates(tab, view, now)}

    def pick_bias(self, key: str, value: str, c: Controls) -> dict:
        """A sampling candidate was clicked ("TOKEN_ID:NONCE"): the logit-bias control takes that
        token (a bias of 0 becomes -100, a ban; the user may move it), for the next request."""
        try:
            token = int(str(value).split(":")[0])
        except ValueError:
            return {}
        tab = self.sessions.get(key)
        view = tab.view if tab is not None else self.blank
        bias = float(c.bias or 0) or -100.0
        piece = viz._html.show_piece(view.piece(token)) if 0 <= token < int(view.model.get("vocab_size") or 0) else "?"
        return {"bias_token": gr.update(value=str(token)), "bias": gr.update(value=bias),
                "more_box": gr.update(open=True),
                "hint_more": f"<div class='tt-note' id='tt-bias-note'>logit bias {bias:+g} on <code>{piece}</code> "
                             f"(id {token}) for the next request: Send to see its row in the sampling stage</div>"}

    def pick_head(self, key: str, value: str) -> dict:
        """A cell of the attention overview was clicked ("LAYER:HEAD:NONCE"): that layer and head,
        in the pickers too."""
        try:
            layer, head = (int(x) for x in str(value).split(":")[:2])
        except ValueError:
            return {}
        view = self.view_of(key)
        if view is self.blank:
            return {}
        select_head = getattr(view, "select_head", None)
        if select_head is not None:
            select_head(layer, head)
        else:
            view.layer, view.head = layer, head
        return {"layer": gr.update(value=layer), "head": gr.update(value=head),
                "attention": view.render("attention"), "moe": view.render("moe"),
                **self.journey_updates(self.sessions.get(key), view, time.perf_counter())}

    # --- "New request", the preview, the classroom button -------------------------------------------
    def unlock(self, key: str, c: Controls) -> dict:
        """"New request": the controls editable again, keeping the replayed request's settings,
        and the panels back to the body Send would post."""
        service = self.service_of(c.model)
        tab = Tab(self.blank_view(service, c), service=service)
        self.sessions.put(key, tab)
        return merged(self.full(tab, tab.view, tx(key, "edit the request and press Send")), self.lock(tab, False),
                      self.no_recording(lang_of(key)))

    def preview(self, key: str, c: Controls) -> dict:
        """A control moved: before any request, the Request panel shows the body Send would post
        now (once a request is shown, that request's body stays)."""
        tab = self.sessions.get(key)
        if tab is not None and (tab.view.request_id or tab.view.validation or tab.cursor is not None):
            return {}
        service = self.service_of(c.model)
        view = self.blank_view(service, c)
        if tab is not None:
            view.layer, view.head, view.pool = tab.view.layer, tab.view.head, tab.view.pool or view.pool
        self.sessions.put(key, Tab(view, service=service))
        return {"request": view.render("request")}

    def start_classroom(self, key: str) -> dict:
        tab = self.tab_of(key)
        err = lambda text: {"class_links": f"<div class='tt-err'>{text}</div>"}  # noqa: E731
        if tab is not None and tab.view.level == "off" and tab.view.request_id:
            return err("Classroom mode walks through a traced request: this one ran at capture level off, which "
                       "records no stages. Send it again at basic or full.")
        rec = tab.cursor.rec if tab is not None and tab.cursor is not None else None
        refresh = None
        if rec is None and tab is not None and tab.view.request_id and tab.service is not None:
            rid, svc = tab.view.request_id, tab.service  # still streaming: walk it live
            refresh = lambda: record_request(svc.store, rid, self.infos[svc.model_name], svc.piece,  # noqa
                                             svc.is_special)
            rec = refresh()
        if rec is None:
            return err("Send a request (or load a trace) first: classroom mode walks through one request.")
        room = self.classrooms.create(rec, refresh)
        return {"class_links": (
            f"<div class='tt-class-links'>Classroom for <b>{viz._html.esc(rec.request_id)}</b>: "
            f"<a id='tt-class-presenter' href='/classroom/{room.room_id}?key={room.key}' target='_blank'>presenter "
            f"view</a> (keep this link to yourself) · <a id='tt-class-audience' href='/classroom/{room.room_id}' "
            f"target='_blank'>audience link</a> (share it: every viewer follows the presenter)</div>")}
