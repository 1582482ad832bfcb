"""Send and Watch: a request streamed into a tab's view, its panels yielded as they come due
(every YIELD_EVERY seconds at most, the heavy ones within RENDER_BUDGET), and Stop."""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Iterator

import gradio as gr

import visualizers as viz
from app.page import texts
from app.page.controls import MAX_PAGE_CHOICES, Controls, parse_schema, parse_seed
from app.page.language import ntx, tx
from app.page.live_view import HEAVY, ONE_PASS, PANELS, LiveView
from app.page.page_state import PageState
from app.page.tabs import Tab
from app.page.updates import carry, merged
from app.serving.engine_service import EngineService, Subscription
from app.serving.limits import RequestRefused
from app.serving.recording import Recording, show_accepted
from app.serving.requests import parse_body
from engine import LLMEngine

YIELD_EVERY = 0.1  # seconds between updates sent to the browser while streaming
RENDER_BUDGET = 0.08  # seconds of heavy-panel drawing per streaming update; the rest waits for the next one
HINTS = ("hint_prompt", "hint_send", "hint_max", "hint_sampling", "hint_more")
HINT_OF = {"messages": "hint_prompt", "prompt": "hint_prompt", "max_tokens": "hint_max",
           "temperature": "hint_sampling", "top_k": "hint_sampling", "top_p": "hint_sampling", "seed": "hint_sampling",
           **{name: "hint_more" for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p",
                                             "min_tokens", "logit_bias", "response_format", "n")}}


def draw_within(view: LiveView, names: list[str], now: float, budget: float = RENDER_BUDGET) -> dict[str, str]:
    """Draw the due panels, the light ones first and then the heavy ones stalest first, until
    the budget is spent (those left stay dirty: the next update draws them), so one update of a
    long trace never holds the stream back behind every heavy panel at once."""
    light = [n for n in names if n not in HEAVY]
    # the panels that name a pass are one unit: drawn together or not at all (never two passes on screen)
    units = [[n] for n in names if n in HEAVY and n not in ONE_PASS] + [[n for n in names if n in ONE_PASS]]
    heavy = sorted((u for u in units if u), key=lambda u: min(view.drawn_at.get(n, 0.0) - now + HEAVY[n] for n in u))
    out = view.draw(light, now)
    start = time.perf_counter()
    for unit in heavy:
        if out and time.perf_counter() - start > budget:
            break
        out.update(view.draw(unit, now))
    return out


REPLACE_WAIT_S = 30.0  # how long a second Send waits for the first's stream to end after stopping it
LENS_WAIT_S = 120.0  # how long a finished answer's page waits for its trace's end (the lenses after its tokens)


def trace_ending(view: LiveView) -> bool:
    """The answer is complete, its trace not yet: a traced request's `finish` event follows the
    logit lenses of its tokens, computed after its last one (engine/trace/lens_queue.py)."""
    return view.finished and view.error is None and "request.arrive" in view.by_type and view.first("finish") is None


def abort_all(service, request_id: str, n: int) -> None:
    """Stop a request and its other choices (n > 1: each is a request of its own in the engine)."""
    for rid in LLMEngine.choice_ids(request_id, n):
        service.abort(rid)


class Streaming(PageState):
    """The handlers that stream a request into a tab: Send (`run`), Watch (`follow`) and Stop."""

    def stream(self, tab: Tab, next_items: Callable[[float], list[dict]], first: dict | None = None,
               final: Callable[[], dict] | None = None, key: str = "") -> Iterator[dict]:
        """Feed the view from next_items until its request finishes, yielding due panels and,
        every JOURNEY_EVERY seconds, the journey (`first`: more updates for the first yield,
        e.g. another model's controls; `final`: more for the last one; `key`: the tab, whose
        language Status speaks)."""
        view, rid, service = tab.view, tab.view.request_id, tab.service
        view.set_pool(service.pool())  # as it is now; the kv.pool events its queue brings follow
        yield merged(self.full(tab, view, tx(key, "{request}: queued", request=rid)), self.stop_look(True), first or {})
        last = 0.0  # the first tokens go out as soon as they come (they waited a period behind the first update)
        while not view.finished:
            view.add(next_items(YIELD_EVERY / 2))
            now = time.perf_counter()
            if now - last >= YIELD_EVERY and not view.finished:
                out = draw_within(view, view.due(now), now)
                if tab.clock.due(now) or any(n in out for n in ONE_PASS):  # the words follow the panels' pass
                    # Status counts the tokens the map's chips count: read from the same events, sent in
                    # the same update (a Status of every yield ran a token ahead of the Stream chip)
                    out.update(self.journey_updates(tab, view, now))
                    out["status"] = ntx(key, "{request}: streaming, {n} token", "{request}: streaming, {n} tokens",
                                        len(view.generated_ids()), request=rid)
                if out:
                    yield out
                    last = now
        view.add(next_items(0))
        if tab.replaced:  # the next Send's updates follow: this one's last ones could land after them
            return
        fin = view.first("finish")
        reason = fin["reason"] if fin else next((o["finish_reason"] for o in view.outputs if o["finished"]), "?")
        now = time.perf_counter()  # the last tokens first, then every panel's final state (Status with the map)
        yield {"answer": view.draw(["answer"], now)["answer"]}
        done = ntx(key, "{request}: finished ({reason}), {n} token", "{request}: finished ({reason}), {n} tokens",
                   len(view.generated_ids()), request=rid, reason=reason)
        yield from self._trace_end(tab, view, next_items, done, key)
        if tab.replaced:
            return
        yield merged(self.full(tab, view, done), self.stop_look(False, can_stop=tab.watched))  # Stop ends a watch
        # then the recording (Export, the step slider); the last yield carries every value (the
        # panels as just drawn: Gradio sends no change for them)
        yield {**{n: view.drawn[n] for n in PANELS}, "status": done, **self.recording_updates(tab),
               **(final() if final else {})}

    def _trace_end(self, tab: Tab, view: LiveView, next_items: Callable[[float], list[dict]], done: str,
                   key: str) -> Iterator[dict]:
        """The answer is shown; its trace's end (the lenses of its tokens, then `finish`) is awaited
        before the final panels and the recording, with Status saying so."""
        def ending() -> bool:  # its own trace, or (n > 1) another choice's, not ended yet
            return trace_ending(view) or (view.finished and view.request_id is not None and getattr(
                tab.service, "trace_open", lambda *_: False)(view.request_id, view.n))
        if not ending():
            return
        # every panel as the answer ends (the newest pass with its lens); the answer is over: nothing to stop
        yield merged(self.full(tab, view, tx(key, "{done} · computing the logit lens of its tokens", done=done)),
                     self.stop_look(False, can_stop=tab.watched))
        end = time.monotonic() + LENS_WAIT_S
        while ending() and time.monotonic() < end and not tab.replaced:
            view.add(next_items(YIELD_EVERY))

    def run(self, key: str, c: Controls, client: str | None = None) -> Iterator[dict]:
        """Send: submit the controls' request and stream it (one at a time per tab)."""
        self.sessions.watching.discard(key)  # Send ends this tab's watching
        busy = self.sessions.claim(key)
        if busy is not None:  # a second Send replaces the first, on every model: stop it, then send
            busy = self._replace(key)
        if busy is not None:  # the first would not end: refuse this one, said under the button
            self.sessions.refused.add(key)
            what = tx(key, "{request} is still streaming in this tab", request=busy) if busy else \
                tx(key, "the last Send is still being submitted in this tab")
            said = tx(key, "⚠ Not sent: {what}. Stop it or wait for it to finish, then press Send again (your prompt "
                           "and settings are kept).", what=what)
            yield {"hint_send": f"<div class='tt-hint'>{viz._html.esc(said)}</div>"}
            return
        try:
            yield from carry(self._send(key, c, client))
        finally:
            self.sessions.release(key)

    def _replace(self, key: str) -> str | None:
        """A Send while this tab's last one streams: stop that one (as Stop does) and take the
        slot once its stream has ended -> None, or what still holds the slot after REPLACE_WAIT_S.
        (Refusing instead made the outcome hang on the model's speed: a fast model had already
        finished, so the second Send ran; a slow one was refused.)"""
        deadline = time.monotonic() + REPLACE_WAIT_S
        while (busy := self.sessions.claim(key)) is not None and time.monotonic() < deadline:
            tab = self.sessions.get(key)
            if busy and tab is not None and tab.view.request_id == busy:
                tab.replaced = True  # (a finished answer whose trace is ending: its page stops waiting)
                if not tab.view.finished:
                    abort_all(tab.service or self.models, busy, tab.view.n)
            self.sessions.wait_free(key, 0.1)  # (its id may not be known yet: look again)
        return busy

    def _refused(self, key: str, e: ValueError, view: LiveView, submission) -> dict:
        """A request refused before or by the engine: the reason under the control it is about, in
        the API's words (they stay English), the page's own around them in the tab's language."""
        checks = getattr(e, "checks", None) or submission.checks + [("engine", False, str(e))]
        view.validation = {"ok": False, "error": str(e), "checks": checks}
        view.error = tx(key, "not sent: {reason}", reason=e)
        param = getattr(e, "param", None)
        if param is None and submission is not None and not isinstance(e, RequestRefused):
            # parsed fine, refused by the engine: a field its message names (a logit_bias id past the
            # vocabulary), else the prompt (empty, too long for the context or the pool)
            param = next((f for f in HINT_OF if str(e).startswith(f)), "messages")
        hint = tx(key, "⚠ {reason}", reason=e)
        return {**{h: "" for h in HINTS}, HINT_OF.get(param, "hint_send"):
                f"<div class='tt-hint'>{viz._html.esc(hint)}</div>", **self.no_recording(view.lang)}

    def _send(self, key: str, c: Controls, client: str | None) -> Iterator[dict]:
        service = self.service_of(c.model)  # the picker offers served models only
        info = self.infos[service.model_name]
        view = self.new_view(service)
        view.layer, view.head = int(c.layer or 0), int(c.head or 0)
        view.speculative = bool(c.speculative)
        view.body = self.body_of(info, c)
        view.n = max(1, min(MAX_PAGE_CHOICES, int(c.n or 1)))
        before = self.sessions.get(key)
        was_locked = before is not None and before.locked  # Send cancelled a watch: the controls are theirs again
        tab = Tab(view, service=service)
        self.sessions.put(key, tab)
        submission = None
        try:
            parse_seed(c.seed)
            parse_schema(c)
            submission = parse_body(view.body, self.models.limits.max_tokens_cap)
            # the server's per-client cap, then the engine's own checks: context, KV pool, vocabulary
            watch = service.submit(submission, client=client, page=client)  # (a browser here: SpareCore)
        except ValueError as e:
            refused = self._refused(key, e, view, submission)
            yield {**self.full(tab, view, tx(key, "rejected: {reason}", reason=e)), **refused}
            return
        view.request_id = watch.request_id
        self.sessions.sending(key, watch.request_id)
        view.validation = {"ok": True, "request_id": watch.request_id, "checks": submission.checks + [
            ("engine", True, f"accepted by {info['name']}; fits the context of {info['max_model_len']:,} tokens "
                             "and the KV pool")]}
        self.sessions.refused.discard(key)
        try:
            # the last request's complaints are gone; its recording is no longer the one shown: said in the
            # stream's first update (an update of its own before it cost Gradio a round of every output, and
            # the first tokens waited behind it)
            first = {**{h: "" for h in HINTS}, **self.no_recording(tab.lang),
                     **(self.lock(tab, False) if was_locked else {})}

            def refused_meanwhile() -> dict:  # a Send was refused while this one streamed: it can go now
                if key not in self.sessions.refused:
                    return {}
                self.sessions.refused.discard(key)
                said = tx(key, "⚠ A Send was refused while {request} streamed; it has finished: press Send to "
                               "send what the controls hold now.", request=watch.request_id)
                return {"hint_send": f"<div class='tt-hint'>{viz._html.esc(said)}</div>"}

            yield from self.stream(tab, watch.drain, first, final=refused_meanwhile, key=key)
        finally:
            service.unsubscribe(watch)
            if not view.finished:  # tab closed or event cancelled: free the engine's work (every choice's)
                threading.Thread(target=abort_all, args=(service, watch.request_id, view.n), daemon=True).start()

    def follow(self, key: str, c: Controls, client: str | None = None) -> Iterator[dict]:
        """Watch: show every request sent by someone else (curl, SDK, another tab) to any of the
        models, one after another; the controls show each request's own prompt, knobs, level and
        model (read-only while watching). client: the page's address (a browser here: SpareCore)."""
        return carry(self._follow(key, c, client))

    def _follow(self, key: str, c: Controls, client: str | None) -> Iterator[dict]:
        fire = self.models.subscribe_all(max_items=20_000)
        arrivals: deque[tuple[str, str | None]] = deque()
        shown = c.model  # the model whose shapes the page draws now

        def note_arrivals(timeout: float) -> None:
            for it in fire.drain(timeout):
                if it["type"] == "request.arrive":
                    arrivals.append((it["request_id"], it.get("model")))

        self.sessions.watching.add(key)
        try:
            waiting = tx(key, "watching: waiting for a request from curl, the SDK or another tab")
            # read-only while watching; Stop (not "New request") ends it
            yield {"status": waiting, **self.lock(self.sessions.get(key), True), "unlock": gr.update(visible=False),
                   **self.stop_look(False, can_stop=True)}
            while True:
                idle_since = time.monotonic()
                while not arrivals:
                    note_arrivals(0.25)
                    # a closed tab ends this generator at a yield; an empty one leaves the status
                    # alone (a learner scrubbing the last request keeps its step's line)
                    if time.monotonic() - idle_since > 2.0:
                        yield {}
                        idle_since = time.monotonic()
                rid, name = arrivals.popleft()
                service = self.models.by_name.get(name) or self.models.owner(rid)
                if service is None:
                    continue
                yield from self._watch_one(key, service, rid, service.model_name != shown, c, note_arrivals, client)
                shown = service.model_name
                yield {"status": tx(key, "{request} finished · watching: waiting for the next request", request=rid)}
        finally:
            self.models.unsubscribe(fire)

    def _watch_one(self, key: str, service: EngineService, rid: str, other: bool, c: Controls,
                   note_arrivals: Callable[[float], None], client: str | None = None) -> Iterator[dict]:
        """Follow one request sent by another client, from what the store holds of it so far
        (a browser here drawing it: the engine leaves it a core while it runs, SpareCore)."""
        sub = service.subscribe(rid)
        local = service.watched_from(rid, client)
        try:
            tr = service.store.trace(rid)
            if tr is None:
                return
            view = self.new_view(service)
            if not other:
                view.layer, view.head = int(c.layer or 0), int(c.head or 0)
            show_accepted(view, rid, tr.body, f"accepted by {service.model_name} (sent by another client)")
            view.n, others = self._watch_choices(service, sub, tr.body)
            backfill = sorted(tr.events + tr.outputs + others, key=lambda i: i["step"])
            seen = {id(i) for i in backfill}
            view.add(backfill)
            tab = Tab(view, watched=True, service=service, locked=True)
            self.sessions.put(key, tab)

            def next_items(timeout: float) -> list[dict]:
                note_arrivals(0)
                return [i for i in sub.drain(timeout) if id(i) not in seen]

            info = self.infos[service.model_name]
            own = self.settings_of(texts.trace_settings(Recording(rid, info, tr.body, backfill, []), info), info)
            # the controls show the request's own settings from its start, set once in the stream's first
            # update: an update of their own before it loses early tokens on screen, and set mid-stream
            # they stall the browser (benchmarks.measure --watch-tokens shows both)
            first = merged(self.controls_for(info, lang=tab.lang) if other else {}, own)  # locked: follow's first yield
            yield from self.stream(tab, next_items, first, key=key)
        finally:
            service.unsubscribe(sub)
            if local:
                service.unwatched(rid)

    @staticmethod
    def _watch_choices(service: EngineService, sub, body: dict | None) -> tuple[int, list[dict]]:
        """A watched request with n > 1: its other choices' outputs into the same queue (subscribed
        before their traces are read, so nothing falls between), and what they streamed so far."""
        n = (body or {}).get("n")
        if not isinstance(n, int) or isinstance(n, bool) or n <= 1:
            return 1, []
        outputs: list[dict] = []
        for cid in LLMEngine.choice_ids(sub.request_id, n)[1:]:
            sub.siblings.append(service.attach(Subscription(cid, sub.queue)))
            tr = service.store.trace(cid)
            outputs += tr.outputs if tr is not None else []
        return n, outputs

    def stop(self, key: str) -> dict:
        """Stop this tab's own request, or end its watching (a watched request is someone else's:
        it goes on). Status says which."""
        tab = self.sessions.get(key)
        if key in self.sessions.watching:
            self.sessions.watching.discard(key)
            unlocked = {**self.lock(tab, False), **self.stop_look(False)}
            if tab is not None and tab.watched and tab.view.request_id and not tab.view.finished:
                return {**unlocked, "status": tx(key, "watching stopped: {request} (another client's request) goes "
                                                      "on; the panels show it as it was when you pressed Stop",
                                                 request=tab.view.request_id)}
            return {**unlocked,
                    "status": tx(key, "watching stopped: press Watch API requests to follow requests again")}
        if tab is not None and not tab.watched and tab.view.request_id and not tab.view.finished:
            abort_all(tab.service or self.models, tab.view.request_id, tab.view.n)  # "finished (abort)"
        return {}
