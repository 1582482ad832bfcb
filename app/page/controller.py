"""The page's controller: each browser tab's state and every handler of the page, as methods
of one object, testable without a browser.

A handler takes the tab's key (Gradio's session hash) and the controls by name (`Controls`),
and returns {output name: value or gr.update(...)}; app/page/layout.py maps the names to its
components (and keeps the page's API outputs in their published order). Names: the panels
(live_view.PANELS), "status", "export", "export_timeline", "step", the hint boxes, the
controls, "map", "stage:KEY" (a stage's sentence), "section:KEY" (a stage's section shown).

Send runs a generator in a worker thread: it submits the request to the engine service and
yields only the panels whose inputs changed, every 0.1 s at most, as HTML (gr.Plot streaming
falls behind and leaks browser memory; HTML does not); the pipeline map and the stages'
sentences follow every JOURNEY_EVERY seconds. Watch follows requests sent by others (curl,
the SDK, other tabs) the same way. A finished request becomes a recording: export it, load
one, scrub or play it step by step, or open it in classroom mode."""
from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable, Iterator

import gradio as gr

import visualizers as viz
from app.classroom.rooms import Classrooms
from app.page import texts
from app.page.live_view import HEAVY, ONE_PASS, PANELS, LiveView
from app.page.stages import JourneyClock
from app.page.step_bar import steps_of, steps_updates, which_steps
from app.page.updates import carry
from app.serving.engine_service import EngineService, Subscription
from app.serving.limits import RequestRefused
from app.serving.recording import Recording, ReplayCursor, TraceFileError, record_request, show_accepted
from app.serving.requests import BodyError, build_body, parse_body
from app.serving.served_models import ServedModels
from engine import LLMEngine
from visualizers.journey import journey
from visualizers.perfetto import perfetto_trace
from visualizers.selection import plural

YIELD_EVERY = 0.1  # seconds between updates sent to the browser while streaming
MAX_SESSIONS = 64
# replay speed -> seconds per step (None: the recorded pace, which on a CPU is too fast to follow)
SPEEDS = {"1 step/s": 1.0, "2 steps/s": 0.5, "5 steps/s": 0.2, "10 steps/s": 0.1, "recorded pace": None}
MIN_FRAME = 0.1  # seconds a replay frame stays up at least (each is a full redraw)
MAX_FRAME = 2.0
RENDER_BUDGET = 0.08  # seconds of heavy-panel drawing per streaming update; the rest waits for the next one
TOO_FAST = 2.0  # an answer streamed in less than this (seconds) was too fast to watch: offer Play
HINTS = ("hint_prompt", "hint_send", "hint_max", "hint_sampling", "hint_more")
HINT_OF = {"messages": "hint_prompt", "prompt": "hint_prompt", "max_tokens": "hint_max",
           "temperature": "hint_sampling", "top_k": "hint_sampling", "top_p": "hint_sampling", "seed": "hint_sampling",
           **{name: "hint_more" for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p",
                                             "min_tokens", "logit_bias", "response_format", "n")}}
# the penalties, min_p / min_tokens, the logit bias, JSON mode and n (issue 26: what a learner would try)
MORE = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens", "bias_token", "bias",
        "json_mode", "schema", "n")
LOCKED = ("system", "user", "temperature", "top_k", "top_p", "max_tokens", "seed", "speculative", "k", "level") + MORE
JSON_MODES = ("off", "JSON object", "JSON schema")
SCHEMA = '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}'
MAX_PAGE_CHOICES = 4  # n on the page: side by side, up to 4


@dataclass
class Controls:
    """Send's controls by name, as the page holds them (values as Gradio gives them)."""
    system: str = "You are a helpful assistant."
    user: str = "Tell me a short story about a fox."
    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 0.95
    max_tokens: int = 48
    seed: str = ""
    speculative: bool = True
    k: int = 1
    level: str = "full"
    model: str | None = None  # the picker: which served model Send goes to
    layer: int = 0
    head: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    bias_token: str = ""  # a token id (a click on a sampling candidate fills it); empty: no logit bias
    bias: float = 0.0
    json_mode: str = "off"  # one of JSON_MODES
    schema: str = SCHEMA  # JSON mode "JSON schema": the schema, as JSON text
    n: int = 1

    @classmethod
    def of(cls, values: dict) -> "Controls":
        """From {name: value}; names not given keep their defaults, unknown names are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{n: v for n, v in values.items() if n in names})

    def as_dict(self) -> dict:
        return asdict(self)


NAMES = tuple(f.name for f in fields(Controls))


@dataclass
class Tab:
    """One browser tab: the view its panels show, and its recording once there is one."""
    view: LiveView
    cursor: ReplayCursor | None = None
    watched: bool = False  # the view follows someone else's request: Stop must not abort it
    service: EngineService | None = None  # the engine of the request shown (None: a loaded trace)
    clock: JourneyClock = field(default_factory=JourneyClock)
    locked: bool = False  # the controls show a replayed or watched request: read-only


class Sessions:
    """Each browser tab's state, by Gradio session hash (bounded, oldest out); which tabs have
    a Send in flight (one at a time: a second is refused, visibly), and which are watching."""

    def __init__(self) -> None:
        self._tabs: OrderedDict[str, Tab] = OrderedDict()
        self._lock = threading.Lock()
        self._sending: dict[str, str] = {}  # tab -> the request its Send is streaming ("" until it has an id)
        self.watching: set[str] = set()
        self.refused: set[str] = set()  # tabs whose Send was refused while their request streamed

    def claim(self, key: str) -> str | None:
        """Take the tab's one Send slot: None when taken now, else what holds it."""
        with self._lock:
            if key in self._sending:
                return self._sending[key]
            self._sending[key] = ""
            return None

    def sending(self, key: str, request_id: str) -> None:
        with self._lock:
            if key in self._sending:
                self._sending[key] = request_id

    def release(self, key: str) -> None:
        with self._lock:
            self._sending.pop(key, None)

    def put(self, key: str, tab: Tab) -> None:
        with self._lock:
            self._tabs[key] = tab
            self._tabs.move_to_end(key)
            while len(self._tabs) > MAX_SESSIONS:
                self._tabs.popitem(last=False)

    def get(self, key: str) -> Tab | None:
        with self._lock:
            return self._tabs.get(key)


def key_of(request) -> str:
    return getattr(request, "session_hash", None) or "default"


def trace_folder() -> Path:
    folder = Path(os.environ.get("GRADIO_TEMP_DIR") or tempfile.gettempdir()) / "tokentrace-traces"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _file_stem(rec: Recording) -> str:
    return f"tokentrace-{''.join(c for c in rec.request_id if c.isalnum() or c in '-_')}"


def write_trace(rec: Recording) -> str:
    path = trace_folder() / f"{_file_stem(rec)}.json"
    path.write_text(rec.dumps())
    return str(path)


def write_timeline(rec: Recording) -> str:
    """The recording's timeline as Chrome trace-event JSON (open it in ui.perfetto.dev)."""
    path = trace_folder() / f"{_file_stem(rec)}.perfetto.json"
    path.write_text(json.dumps(perfetto_trace(rec.events, rec.request_id, rec.model.get("name"))))
    return str(path)


def parse_seed(value) -> int | None:
    """The seed box: empty for a random draw, else an integer (BodyError otherwise)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise BodyError("the seed must be an integer (or empty for a random draw)", "seed",
                        [("sampling", False, "seed is not an integer")])
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return int(str(value).strip())
    except ValueError:
        raise BodyError(f"the seed must be an integer (or empty for a random draw), got {str(value)[:40]!r}",
                        "seed", [("sampling", False, "seed is not an integer")]) from None


def more_fields(c: Controls) -> dict:
    """The body fields of the extra controls that are on (a knob at its neutral value sends
    nothing, as a client would not). A token id or schema that is not valid stays as typed:
    parse_body refuses it, and the page says why under the controls."""
    out: dict = {}
    for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0),
                          ("min_p", 0.0)):
        value = float(getattr(c, name) if getattr(c, name) is not None else neutral)
        if value != neutral:
            out[name] = value
    if int(c.min_tokens or 0):
        out["min_tokens"] = int(c.min_tokens)
    token = str(c.bias_token or "").strip()
    if token and float(c.bias or 0):
        out["logit_bias"] = {token: float(c.bias)}
    if c.json_mode == "JSON object":
        out["response_format"] = {"type": "json_object"}
    elif c.json_mode == "JSON schema":
        try:
            schema = json.loads(c.schema or "")
        except ValueError:
            schema = c.schema  # refused by parse_schema before Send
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    if int(c.n or 1) > 1:
        out["n"] = int(c.n)
    return out


def parse_schema(c: Controls) -> None:
    """JSON mode's schema box: a JSON object (BodyError otherwise, said under the box)."""
    if c.json_mode != "JSON schema":
        return
    try:
        schema = json.loads(c.schema or "")
    except ValueError as e:
        raise BodyError(f"the JSON schema is not valid JSON: {e}", "response_format",
                        [("sampling", False, "the schema is not JSON")]) from None
    if not isinstance(schema, dict):
        raise BodyError("the JSON schema must be a JSON object, e.g. " + SCHEMA, "response_format",
                        [("sampling", False, "the schema is not an object")])


def merged(*parts: dict) -> dict:
    """Several {name: value or update} dicts as one (a value and an update of one output
    become one update)."""
    out: dict = {}
    for part in parts:
        for name, val in part.items():
            if name in out and (isinstance(out[name], dict) or isinstance(val, dict)):
                old = out[name] if isinstance(out[name], dict) else gr.update(value=out[name])
                val = {**old, **(val if isinstance(val, dict) else {"value": val})}
            out[name] = val
    return out


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


def abort_all(service, request_id: str, n: int) -> None:
    """Stop a request and its other choices (n > 1: each is a request of its own in the engine)."""
    for rid in LLMEngine.choice_ids(request_id, n):
        service.abort(rid)


def stages_of(view: LiveView) -> list:
    """The journey of the request a view shows (the pipeline map and the stages' sentences)."""
    # the words speak of the pass the panels show now (their last draw), not of a newer one
    position = view.shown_read if view.shown_read is not None else view.position
    with view.lock:  # (a click's journey beside the stream's: one fold of its events at a time)
        return journey(view.model, view.request_id or "", view.body or None, view.events, view.outputs,
                       truncated=view.first("trace.truncated"), position=position, trail=view.trail())


class Controller:
    """Every handler of the page, over the tabs' state. served: the models Send may go to
    (None: a replay-only page showing `replay`)."""

    def __init__(self, served: ServedModels | EngineService | None, replay: Recording | None = None,
                 classrooms: Classrooms | None = None) -> None:
        self.models = ServedModels.of(served) if served is not None else None
        self.live = self.models is not None
        self.replay = replay
        self.infos = {s.model_name: texts.with_defaults(s.model_info()) for s in self.models} if self.live else {}
        self.model = self.infos[self.models.first.model_name] if self.live else texts.with_defaults(replay.model)
        self.sessions = Sessions()
        self.classrooms = classrooms or Classrooms()
        self.cap = self.models.limits.max_tokens_cap if self.live and self.models.limits.max_tokens_cap else 512
        # the controls when the page opens (the Request panel's first body is built from them too)
        self.opening = Controls(max_tokens=min(Controls.max_tokens, self.cap), model=self.model["name"],
                                speculative=self.model["has_draft"], k=self.model["num_speculative_tokens"])
        if self.live:
            self.blank, self.first_frames = self.blank_view(self.models.first), 0
        else:
            first = ReplayCursor(replay)
            self.blank, self.first_frames = first.goto(first.last_frame), first.last_frame + 1

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
    def journey_updates(self, tab: Tab | None, view: LiveView, now: float, force: bool = False) -> dict:
        """The pipeline map and the stages' sentences (only what changed since the last time)."""
        clock = tab.clock if tab is not None else JourneyClock()
        out = clock.updates(stages_of(view), now, live=view.request_id is not None, force=force)
        return {n: (gr.update(visible=v) if n.startswith("section:") else v) for n, v in out.items()}

    def full(self, tab: Tab | None, view: LiveView, state: str) -> dict:
        """Every panel, the journey and Status."""
        now = time.perf_counter()
        return {**view.draw(list(PANELS), now), **self.journey_updates(tab, view, now), "status": state}

    def opening_page(self, key: str) -> dict:
        """What a tab shows when it (re)loads: the journey of what it shows."""
        tab = self.tab_of(key)
        view = tab.view if tab is not None else self.blank
        return self.journey_updates(None, view, time.perf_counter(), force=True)

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

    def stop_look(self, running: bool) -> dict:
        """Stop is red only while something runs that it would stop."""
        return {"stop": gr.update(variant="stop" if running else "secondary")}

    def controls_for(self, info: dict, served_model: bool = True) -> dict:
        """Updates for every control and panel frame that depends on the model shown: the picker
        and Send's controls too when it is one of the served models (not a loaded trace)."""
        out = {"summary": texts.model_summary(info), "moe_col": gr.update(visible=info["is_moe"]),
               "layer": gr.update(choices=list(range(info["num_layers"])), value=0),
               "head": gr.update(choices=list(range(info["num_heads"])), value=0)}
        if served_model:
            plain = not info["chat_template"]
            out.update({"model_pick": gr.update(value=info["name"]), "note": texts.model_note(info, len(self.infos)),
                        "system": gr.update(label=texts.SYSTEM_LABEL[plain], interactive=not plain),
                        "user": gr.update(label=texts.USER_LABEL[plain]),
                        "speculative": gr.update(value=info["has_draft"], interactive=info["has_draft"],
                                                 info=texts.spec_info(info)),
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
        out["max_tokens"] = gr.update(value=min(got["max_tokens"], self.cap))
        if info["name"] in self.infos:  # a served model: its draft decides whether speculation can be on
            out["speculative"] = gr.update(value=got["speculative"] and info["has_draft"])
            out["k"] = gr.update(value=max(1, min(got["k"], info["num_speculative_tokens"])))
        else:  # not served here: the controls still say what the trace's request used
            out["speculative"] = gr.update(value=got["speculative"])
            out["k"] = gr.update(value=max(1, got["k"]), maximum=max(1, got["k"]), visible=bool(got["speculative"]))
        return out

    def no_recording(self) -> dict:
        return {"export": gr.update(value=None, interactive=False), **steps_updates(None),
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
            return self.no_recording()
        tab.cursor = ReplayCursor(rec)
        tab.cursor.adopt(view)  # the live view already shows the last frame
        return {"export": gr.update(value=write_trace(rec), interactive=True), **steps_updates(tab.cursor),
                "export_timeline": gr.update(value=write_timeline(rec), interactive=bool(rec.events)),
                "replay_note": texts.too_fast_note(view.stream_tokens(), len(tab.cursor.steps), TOO_FAST,
                                                   which_steps(tab.cursor))}

    # --- streaming ------------------------------------------------------------------------------
    def stream(self, tab: Tab, next_items: Callable[[float], list[dict]], first: dict | None = None,
               final: Callable[[], dict] | None = None) -> Iterator[dict]:
        """Feed the view from next_items until its request finishes, yielding due panels and,
        every JOURNEY_EVERY seconds, the journey (`first`: more updates for the first yield,
        e.g. another model's controls; `final`: more for the last one)."""
        view, rid, service = tab.view, tab.view.request_id, tab.service
        view.set_pool(service.pool())  # as it is now; the kv.pool events its queue brings follow
        yield merged(self.full(tab, view, f"{rid}: queued"), self.stop_look(True), first or {})
        last = 0.0  # the first tokens go out as soon as they come (they waited a period behind the first update)
        while not view.finished:
            view.add(next_items(YIELD_EVERY / 2))
            now = time.perf_counter()
            if now - last >= YIELD_EVERY and not view.finished:
                out = draw_within(view, view.due(now), now)
                if tab.clock.due(now) or any(n in out for n in ONE_PASS):  # the words follow the panels' pass
                    out.update(self.journey_updates(tab, view, now))
                if out:
                    yield {**out, "status": f"{rid}: streaming, {plural(len(view.generated_ids()), 'token')}"}
                    last = now
        view.add(next_items(0))
        fin = view.first("finish")
        reason = fin["reason"] if fin else next((o["finish_reason"] for o in view.outputs if o["finished"]), "?")
        now = time.perf_counter()  # the last tokens first, then every panel's final state
        yield {"answer": view.draw(["answer"], now)["answer"],
               "status": f"{rid}: streaming, {plural(len(view.generated_ids()), 'token')}"}
        done = f"{rid}: finished ({reason}), {plural(len(view.generated_ids()), 'token')}"
        yield merged(self.full(tab, view, done), self.stop_look(False))
        # then the recording (Export, the step slider); the last yield carries every value (the
        # panels as just drawn: Gradio sends no change for them)
        yield {**{n: view.drawn[n] for n in PANELS}, "status": done, **self.recording_updates(tab),
               **(final() if final else {})}

    def run(self, key: str, c: Controls, client: str | None = None) -> Iterator[dict]:
        """Send: submit the controls' request and stream it (one at a time per tab)."""
        self.sessions.watching.discard(key)  # Send ends this tab's watching
        busy = self.sessions.claim(key)
        if busy is not None:  # one request per tab: refuse a second Send, said under the button
            self.sessions.refused.add(key)
            what = f"{busy} is still streaming" if busy else "the last Send is still being submitted"
            yield {"hint_send": f"<div class='tt-hint'>⚠ Not sent: {viz._html.esc(what)} in this tab. Stop it or "
                                "wait for it to finish, then press Send again (your prompt and settings are kept)."
                                "</div>"}
            return
        try:
            yield from carry(self._send(key, c, client))
        finally:
            self.sessions.release(key)

    def _refused(self, e: ValueError, view: LiveView, submission) -> dict:
        """A request refused before or by the engine: the reason under the control it is about."""
        checks = getattr(e, "checks", None) or submission.checks + [("engine", False, str(e))]
        view.validation = {"ok": False, "error": str(e), "checks": checks}
        view.error = f"not sent: {e}"
        param = getattr(e, "param", None)
        if param is None and submission is not None and not isinstance(e, RequestRefused):
            # parsed fine, refused by the engine: a field its message names (a logit_bias id past the
            # vocabulary), else the prompt (empty, too long for the context or the pool)
            param = next((f for f in HINT_OF if str(e).startswith(f)), "messages")
        return {**{h: "" for h in HINTS}, HINT_OF.get(param, "hint_send"):
                f"<div class='tt-hint'>⚠ {viz._html.esc(e)}</div>", **self.no_recording()}

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
            watch = service.submit(submission, client=client)
        except ValueError as e:
            refused = self._refused(e, view, submission)
            yield {**self.full(tab, view, f"rejected: {e}"), **refused}
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
            first = {**{h: "" for h in HINTS}, **self.no_recording(), **(self.lock(tab, False) if was_locked else {})}

            def refused_meanwhile() -> dict:  # a Send was refused while this one streamed: it can go now
                if key not in self.sessions.refused:
                    return {}
                self.sessions.refused.discard(key)
                return {"hint_send": f"<div class='tt-hint'>⚠ A Send was refused while {watch.request_id} "
                                     "streamed; it has finished: press Send to send what the controls hold now.</div>"}

            yield from self.stream(tab, watch.drain, first, final=refused_meanwhile)
        finally:
            service.unsubscribe(watch)
            if not view.finished:  # tab closed or event cancelled: free the engine's work (every choice's)
                threading.Thread(target=abort_all, args=(service, watch.request_id, view.n), daemon=True).start()

    def follow(self, key: str, c: Controls) -> Iterator[dict]:
        """Watch: show every request sent by someone else (curl, SDK, another tab) to any of the
        models, one after another; the controls show each request's own prompt, knobs, level and
        model (read-only while watching)."""
        return carry(self._follow(key, c))

    def _follow(self, key: str, c: Controls) -> Iterator[dict]:
        fire = self.models.subscribe_all(max_items=20_000)
        arrivals: deque[tuple[str, str | None]] = deque()
        shown = c.model  # the model whose shapes the page draws now

        def note_arrivals(timeout: float) -> None:
            for it in fire.drain(timeout):
                if it["type"] == "request.arrive":
                    arrivals.append((it["request_id"], it.get("model")))

        self.sessions.watching.add(key)
        try:
            waiting = "watching: waiting for a request from curl, the SDK or another tab"
            # read-only while watching; Stop (not "New request") ends it
            yield {"status": waiting, **self.lock(self.sessions.get(key), True), "unlock": gr.update(visible=False)}
            while True:
                idle_since = time.monotonic()
                while not arrivals:
                    note_arrivals(0.25)
                    if time.monotonic() - idle_since > 2.0:  # a closed tab ends this generator at a yield
                        yield {"status": waiting}
                        idle_since = time.monotonic()
                rid, name = arrivals.popleft()
                service = self.models.by_name.get(name) or self.models.owner(rid)
                if service is None:
                    continue
                yield from self._watch_one(key, service, rid, service.model_name != shown, c, note_arrivals)
                shown = service.model_name
                yield {"status": f"{rid} finished · watching: waiting for the next request"}
        finally:
            self.models.unsubscribe(fire)

    def _watch_one(self, key: str, service: EngineService, rid: str, other: bool, c: Controls,
                   note_arrivals: Callable[[float], None]) -> Iterator[dict]:
        """Follow one request sent by another client, from what the store holds of it so far."""
        sub = service.subscribe(rid)
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
            # update (measured, benchmarks.measure --watch-tokens 80, interleaved runs on a loaded machine:
            # token lag as with the sliders at the end; an update of their own before it lost early tokens
            # on screen; set mid-stream they stalled the browser 0.5-3 s, as the last session found)
            first = merged(self.controls_for(info) if other else {}, own)  # locked already: follow's first yield
            yield from self.stream(tab, next_items, first)
        finally:
            service.unsubscribe(sub)

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
                return {**unlocked, "status": f"watching stopped: {tab.view.request_id} (another client's request) "
                                              "goes on; the panels show it as it was when you pressed Stop"}
            return {**unlocked, "status": "watching stopped: press Watch API requests to follow requests again"}
        if tab is not None and not tab.watched and tab.view.request_id and not tab.view.finished:
            abort_all(tab.service or self.models, tab.view.request_id, tab.view.n)  # "finished (abort)"
        return {}

    # --- the model picker, the pickers, a token click ----------------------------------------------
    def pick_model(self, key: str, c: Controls) -> dict:
        """The picker moved: Send's controls, the selectors and every panel follow that model
        (a request still streaming in this tab keeps its panels until it ends)."""
        self.sessions.watching.discard(key)  # picking ends watching
        service = self.service_of(c.model)
        info = self.infos[service.model_name]
        out = self.controls_for(info)
        del out["model_pick"]  # the user's own move
        tab = self.sessions.get(key)
        if tab is not None and not tab.watched and tab.view.request_id and not tab.view.finished:
            return {n: v for n, v in out.items() if n not in ("summary", "moe_col", "layer", "head")}
        mine = Controls(**{**c.as_dict(), "speculative": info["has_draft"], "k": info["num_speculative_tokens"]})
        tab = Tab(self.blank_view(service, mine), service=service)
        self.sessions.put(key, tab)
        ready = f"{info['name']}: Send goes to this model" + ("" if info["chat_template"] else
                                                               " (plain-prompt mode: no chat template)")
        return merged(self.full(tab, tab.view, ready), self.lock(tab, False), out, self.no_recording(),
                      self.stop_look(False))

    def redraw(self, key: str, c: Controls) -> dict:
        """The layer or head picker moved: attention and MoE at that layer and head."""
        view = self.view_of(key)
        select_head = getattr(view, "select_head", None)  # the one selection (live_view), where it exists
        if select_head is not None:
            select_head(int(c.layer or 0), int(c.head or 0))
        else:
            view.layer, view.head = int(c.layer or 0), int(c.head or 0)
        return {"attention": view.render("attention"), "moe": view.render("moe")}

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
                "attention": view.render("attention"), "moe": view.render("moe")}

    # --- replay ---------------------------------------------------------------------------------
    def show_frame(self, tab: Tab, frame: int, note: str = "") -> dict:
        """Every panel at one frame (0-based) of the tab's recording; Status and the slider both
        count engine steps from 1."""
        picked = tab.view.position if tab.view is not None else None
        view = tab.cursor.goto(frame)
        view.position = picked
        view.replaying = True
        tab.view = view
        state = f"{tab.cursor.rec.request_id}: step {tab.cursor.frame + 1} of {steps_of(tab.cursor)}"
        return {**self.full(tab, view, state + note), "step": gr.update(value=tab.cursor.frame + 1),
                "step_box": gr.update(value=tab.cursor.frame + 1)}

    def goto(self, key: str, number, c: Controls) -> dict:
        """The slider or its number box moved: that step (a number out of range is clamped, and
        Status says so)."""
        tab = self.tab_of(key)
        if tab is None or tab.cursor is None:
            return {"status": "nothing to replay yet: send a request or load a trace", **steps_updates(None)}
        tab.cursor.view.layer, tab.cursor.view.head = int(c.layer or 0), int(c.head or 0)
        n = len(tab.cursor.steps)
        wanted, note = texts.clamp_step(number, n)
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
            yield {"status": "nothing to replay yet: send a request or load a trace"}
            return
        cur = tab.cursor
        cur.view.layer, cur.view.head = int(c.layer or 0), int(c.head or 0)
        wanted, _ = texts.clamp_step(number, len(cur.steps))
        frame = wanted - 1
        first = 0 if frame >= cur.last_frame else max(0, frame)
        yield merged(self.replaying(tab), self.show_frame(tab, first, " · playing"), {"replay_note": ""})
        while cur.frame < cur.last_frame:
            pace = SPEEDS.get(speed_name, 0.5)
            time.sleep(min(MAX_FRAME, max(MIN_FRAME, cur.seconds_to_next() if pace is None else pace)))
            yield self.show_frame(tab, cur.frame + 1, " · playing" if cur.frame + 1 < cur.last_frame else "")

    def paused(self, key: str) -> dict:
        tab = self.tab_of(key)
        if tab is None or tab.cursor is None or tab.cursor.frame < 0:
            return {}
        cur = tab.cursor
        return {"status": f"{cur.rec.request_id}: paused at step {cur.frame + 1} of {steps_of(cur)}"}

    def load_trace(self, key: str, path: str) -> dict:
        """A trace file loaded: its last step, the controls set to its request (read-only)."""
        try:
            rec = Recording.loads(Path(path).read_bytes())
        except (TraceFileError, OSError) as e:
            return {"status": f"cannot load the trace: {e}"}
        self.sessions.watching.discard(key)
        tab = Tab(rec.new_view(), ReplayCursor(rec), locked=True)
        self.sessions.put(key, tab)
        out = self.show_frame(tab, tab.cursor.last_frame, f" · loaded {Path(path).name}")
        # the trace's own model draws the selectors (from layer 0); a served one takes the picker too
        info = texts.with_defaults(rec.model)
        controls = self.controls_for(info, served_model=info["name"] in self.infos)
        return merged(out, controls, self.settings_updates(rec, info), self.lock(tab, True),
                      {"export": gr.update(value=write_trace(rec), interactive=True), **steps_updates(tab.cursor),
                       "export_timeline": gr.update(value=write_timeline(rec), interactive=bool(rec.events))})

    def unlock(self, key: str, c: Controls) -> dict:
        """"New request": the controls editable again, keeping the replayed request's settings,
        and the panels back to the body Send would post."""
        service = self.service_of(c.model)
        tab = Tab(self.blank_view(service, c), service=service)
        self.sessions.put(key, tab)
        return merged(self.full(tab, tab.view, "edit the request and press Send"), self.lock(tab, False),
                      self.no_recording())

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
