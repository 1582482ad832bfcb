"""The Gradio page's layout, a focus layout: a sidebar that stays in view (the prompt, Send,
Status and the answer as it streams; then the settings and, at its foot, the replay and the
classroom) beside the pipeline map, which stays on top of one section per stage of the
request (a chip brings its section under the map), in the order a request travels
(visualizers.journey: request -> tokenize -> prefix cache -> embed -> layers -> prefill /
decode -> KV pages -> LM head and logit lens -> sampling -> stream -> batching ->
speculation -> parallelism), each its sentence then its panels. A stage this request skips
is one line in the map and no section.

Every handler is a method of the `Controller`, which takes the controls by
name and returns {output name: value}; `Wiring` maps those names to the components built here
and keeps the page's API (/send, /stop, /kv_calculator) with its outputs in their published
order. With no engine (`--replay FILE`) the page only replays.
"""
from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Callable

import gradio as gr

import visualizers as viz
from app.classroom.rooms import Classrooms
from app.page import language, texts
from app.page.code_panel import CSS as CODE_CSS, code_views
from app.page.controller import Controller
from app.page.controls import JSON_MODES, MAX_PAGE_CHOICES, MORE, Controls
from app.page.lab_tab import build_lab_tab
from app.page.library_tab import build_library_tab
from app.page.live_view import PANELS
from app.page.page_state import stages_of
from app.page.replay import SPEEDS
from app.page.samples import sample_picker, wire_samples
from app.page.second_request import LABEL as SECOND, send_second
from app.page.skips import SkipBlocks
from app.page.stages import empty_stages, map_html, section_panels, stage_html
from app.page.tabs import key_of, lang_of
from app.page.texts import model_summary  # noqa: F401 - the page's model line, read by tests
from visualizers import i18n
from app.page.trace_files import write_timeline, write_trace
from app.serving.engine_service import EngineService
from app.serving.limits import client_of
from app.page.step_bar import first_bar
from app.serving.recording import Recording, ReplayCursor
from app.serving.requests import TRACE_LEVELS
from app.serving.served_models import ServedModels
from visualizers.journey import KEYS

CSS = (Path(__file__).with_name("page.css")).read_text() + "\n" + (
    Path(__file__).with_name("panels.css").read_text() if Path(__file__).with_name("panels.css").exists() else "") \
    + CODE_CSS + "\n" + language.CSS
# a Chinese page hidden until its load made it Chinese; hover tips, token picks; code points; a chip's
# section in view; the answer's newest lines in view; a stage's code view fetched when it opens
# the words the page's scripts write themselves, from the catalogs, per language (<html lang> picks)
JS_WORDS = {tag: {"noGlyph": i18n.gettext(lang, "no font here draws {text}: written as its code points")}
            for tag, lang in (("en", "en"), ("zh-CN", "zh_CN"))}
HEAD = f"<script>window.TT_WORDS = {json.dumps(JS_WORDS, ensure_ascii=False)};</script>" + "".join(
    f"<script>{Path(__file__).with_name(js).read_text()}</script>"
    for js in ("first_paint.js", "hover.js", "glyphs.js", "focus.js", "follow.js", "code.js"))
LATER_PANELS = ("logit_lens", "parallel")  # panels added after the page's API was published: last in its outputs
NEWEST = ("choices",)
SIDEBAR = ("answer",)  # panels drawn beside the map (under Send), not in their stage's section  # added later still: at the very end of the outputs (after the extra controls)
SEND_INPUTS = ("system", "user", "temperature", "top_k", "top_p", "max_tokens", "seed", "speculative", "k", "level",
               "layer", "head", "model") + MORE  # /send's positional inputs, in the published order (new ones last)
SETTINGS = ("system", "user", "temperature", "top_k", "top_p", "max_tokens", "seed", "speculative", "k",
            "level") + MORE


class Wiring:
    """Names -> components, and handlers as Gradio functions: a Controller method's
    {name: value} becomes {component: value}; names the page does not have are dropped."""

    def __init__(self, ui: dict[str, gr.components.Component]) -> None:
        self.ui = ui

    def out(self, named: dict, keep: str = "status", key: str | None = None) -> dict:
        """keep: the output given a no-op update when nothing changes (Gradio needs one); key: the
        tab, whose language the labels a handler sets are given in."""
        named = language.localized(lang_of(key), named) if key else named
        return {self.ui[n]: v for n, v in named.items() if n in self.ui} or {self.ui[keep]: gr.update()}

    def controls(self, names: tuple[str, ...], values: tuple) -> Controls:
        return Controls.of(dict(zip(names, values)))

    def fn(self, handler: Callable, names: tuple[str, ...] = (), extra: int = 0, keep: str = "status") -> Callable:
        """handler(key, *extra values, Controls) -> {name: value}, as fn(request, *values)."""
        def call(request: gr.Request, *values):
            args = list(values[:extra]) + ([self.controls(names, values[extra:])] if names else [])
            return self.out(handler(key_of(request), *args), keep, key_of(request))
        return call

    def gen(self, handler: Callable, names: tuple[str, ...] = (), extra: int = 0, client: bool = False) -> Callable:
        """fn's for a handler that yields {name: value} as it goes; client: the page's address
        (client_of) passed last (a browser on this machine gets a core while it draws: SpareCore)."""
        def call(request: gr.Request, *values):
            args = list(values[:extra]) + ([self.controls(names, values[extra:])] if names else [])
            for named in handler(key_of(request), *args, *((client_of(request),) if client else ())):
                yield self.out(named, key=key_of(request))
        return call

    def inputs(self, names: tuple[str, ...]) -> list:
        return [self.ui[n] for n in names]


def _ask(ui: dict, ctl: Controller) -> None:
    """The prompt, Send and Status, then the answer as it streams: the sidebar's top, the first
    thing on every screen (a phone's too)."""
    live, opening, plain = ctl.live, ctl.opening, not ctl.model["chat_template"]
    ui["user"] = gr.Textbox(label=texts.USER_LABEL[plain], lines=3, value=opening.user, elem_id="tt-user",
                            interactive=live)
    ui["hint_prompt"] = gr.HTML("", elem_id="tt-hint-prompt", padding=False, elem_classes=["tt-hint-box"])
    ui["samples"] = sample_picker(live)
    with gr.Row(elem_id="tt-send-row"):
        ui["send"] = gr.Button("Send", variant="primary", elem_id="tt-send", interactive=live, min_width=70)
        ui["stop"] = gr.Button("Stop", variant="secondary", elem_id="tt-stop", interactive=False,  # nothing runs yet
                               min_width=70)
        ui["watch"] = gr.Button("Watch API requests", elem_id="tt-watch", interactive=live, min_width=120)
    ui["unlock"] = gr.Button("✎ New request (keep these settings)", size="sm", elem_id="tt-unlock", visible=False)
    ui["hint_send"] = gr.HTML("", elem_id="tt-hint-send", padding=False, elem_classes=["tt-hint-box"])
    ui["status"] = gr.Textbox(label="Status", show_label=False, placeholder="Status", interactive=False,
                              elem_id="tt-status",
                              value="" if live else f"replaying {ctl.replay.request_id}")
    _panel(ui, "answer", ctl.blank)


def _controls(ui: dict, ctl: Controller) -> None:
    """Send's settings, under the answer in the sidebar."""
    m, live, opening = ctl.model, ctl.live, ctl.opening
    choices = [(texts.model_choice(i), name) for name, i in ctl.infos.items()] if live else \
        [(texts.model_choice(m), m["name"])]
    ui["model"] = ui["model_pick"] = gr.Dropdown(choices, value=m["name"], label="Model", elem_id="tt-model",
                                                 interactive=live and len(choices) > 1,
                                                 info="every panel draws the picked model's shapes")
    ui["note"] = gr.HTML(texts.model_note(m, len(ctl.infos)), elem_id="tt-model-note", padding=False)
    ui["summary"] = gr.HTML(texts.model_summary(m), elem_id="tt-model-summary", padding=False)
    plain = not m["chat_template"]
    ui["system"] = gr.Textbox(label=texts.SYSTEM_LABEL[plain], lines=2, value=opening.system, elem_id="tt-system",
                              interactive=live and not plain)
    ui["temperature"] = gr.Slider(0, 2, value=opening.temperature, step=0.05, label="Temperature (0 = greedy)",
                                  elem_id="tt-temperature", interactive=live)
    ui["top_k"] = gr.Slider(0, min(200, m["vocab_size"]), value=opening.top_k, step=1, label="Top-k (0 = off)",
                            elem_id="tt-top-k", interactive=live)
    ui["top_p"] = gr.Slider(0.05, 1, value=opening.top_p, step=0.01, label="Top-p (1 = off)", elem_id="tt-top-p",
                            interactive=live)
    ui["max_tokens"] = gr.Slider(1, ctl.cap, value=opening.max_tokens, step=1,
                                 label=texts.max_label(ctl.cap, ctl.model.get("max_model_len")),
                                 elem_id="tt-max-tokens", interactive=live)
    ui["hint_max"] = gr.HTML("", elem_id="tt-hint-max-tokens", padding=False, elem_classes=["tt-hint-box"])
    # a Textbox, not a Number: gr.Number shows (and sends) 0 for an empty value
    # at temperature 0 the draw is the argmax: a seed changes nothing there
    ui["seed"] = gr.Textbox(value=opening.seed, elem_id="tt-seed",
                            label="Seed (for temperature > 0, empty = a random draw; greedy needs none)",
                            placeholder="random", max_lines=1, interactive=live)
    ui["hint_sampling"] = gr.HTML("", elem_id="tt-hint-sampling", padding=False, elem_classes=["tt-hint-box"])
    with gr.Row(elem_id="tt-spec-row"):
        ui["speculative"] = gr.Checkbox(value=m["has_draft"], interactive=live and m["has_draft"],
                                        label="Speculative decoding", info=texts.spec_info(m),
                                        elem_id="tt-speculative")
        ui["k"] = gr.Slider(1, max(1, m["num_speculative_tokens"]), value=m["num_speculative_tokens"], step=1,
                            label="Draft tokens k", interactive=live and m["has_draft"], elem_id="tt-k",
                            visible=m["has_draft"])  # no draft: nothing to choose (the checkbox says why)
    ui["level"] = gr.Radio(list(TRACE_LEVELS), value=opening.level, label="Capture level", elem_id="tt-level",
                           interactive=live,
                           info="full: tensors (embeddings, attention, MoE); basic: no tensors; off: only the "
                                "streamed tokens, their timing and the usage")
    _more_controls(ui, ctl)


def _more_controls(ui: dict, ctl: Controller) -> None:
    """What a learner would try of the API's sampling fields (issue 26): each is a stage of the
    sampling chain the Sample stage shows (penalties, min_tokens, the logit bias, the grammar
    mask), and n choices side by side under the Stream stage."""
    live, o = ctl.live, ctl.opening
    with gr.Accordion("Penalties, logit bias, JSON mode, n choices", open=False, elem_id="tt-more") as box:
        ui["more_box"] = box
        with gr.Row():
            ui["presence_penalty"] = gr.Slider(-2, 2, value=o.presence_penalty, step=0.1, label="Presence penalty",
                                               elem_id="tt-presence", interactive=live)
            ui["frequency_penalty"] = gr.Slider(-2, 2, value=o.frequency_penalty, step=0.1,
                                                label="Frequency penalty", elem_id="tt-frequency", interactive=live)
        with gr.Row():
            ui["repetition_penalty"] = gr.Slider(0.5, 2, value=o.repetition_penalty, step=0.05,
                                                 label="Repetition penalty (1 = off)", elem_id="tt-repetition",
                                                 interactive=live)
            ui["min_p"] = gr.Slider(0, 1, value=o.min_p, step=0.01, label="Min-p (0 = off)", elem_id="tt-min-p",
                                    interactive=live)
        ui["min_tokens"] = gr.Slider(0, ctl.cap, value=o.min_tokens, step=1, label="Min tokens (no end before)",
                                     elem_id="tt-min-tokens", interactive=live)
        with gr.Row():
            ui["bias_token"] = gr.Textbox(value=o.bias_token, label="Logit bias: token id", max_lines=1,
                                          placeholder="click a token in the Sampling table", elem_id="tt-bias-token",
                                          interactive=live)
            ui["bias"] = gr.Slider(-100, 100, value=o.bias, step=1, label="bias (−100 bans it)", elem_id="tt-bias",
                                   interactive=live)
        ui["json_mode"] = gr.Radio(list(JSON_MODES), value=o.json_mode, label="JSON mode (a grammar masks the "
                                   "tokens that cannot continue valid JSON)", elem_id="tt-json-mode", interactive=live)
        ui["schema"] = gr.Textbox(value=o.schema, label="JSON schema (JSON mode: JSON schema)", lines=2,
                                  elem_id="tt-schema", interactive=live)
        ui["n"] = gr.Slider(1, MAX_PAGE_CHOICES, value=o.n, step=1, label="Choices n (side by side)", elem_id="tt-n",
                            interactive=live)
        ui["hint_more"] = gr.HTML("", elem_id="tt-hint-more", padding=False, elem_classes=["tt-hint-box"])


def _replay_bar(ui: dict, ctl: Controller) -> None:
    """Load / export / play / the step slider / classroom: at the sidebar's foot on a wide
    screen, under the answer on a phone (page.css orders them). Play and Pause wait for a
    recording of more than one step (steps_updates turns them on)."""
    replay = ctl.replay
    first, note = first_bar(None if ctl.live else ReplayCursor(replay))
    with gr.Column(elem_id="tt-replay-box"):
        gr.HTML("<div class='tt-box-title'>Replay and classroom</div>", padding=False,
                elem_classes=[language.TRANSLATED])
        with gr.Row(equal_height=False, elem_id="tt-replay"):
            ui["load"] = gr.UploadButton("Load trace", file_types=[".json"], size="sm", elem_id="tt-load",
                                         min_width=90)
            ui["export"] = gr.DownloadButton("Export trace", value=write_trace(replay) if replay else None, size="sm",
                                             elem_id="tt-export", interactive=not ctl.live, min_width=90)
            ui["export_timeline"] = gr.DownloadButton(
                "Export timeline", value=write_timeline(replay) if replay else None, size="sm",
                elem_id="tt-export-timeline", interactive=not ctl.live, min_width=110)
            ui["class_btn"] = gr.Button("Classroom", size="sm", elem_id="tt-class-start", min_width=90)
        with gr.Row(equal_height=False, elem_id="tt-play-row"):
            ui["play"] = gr.Button("▶ Play", size="sm", elem_id="tt-play", min_width=70,
                                   interactive=first["visible"])
            ui["pause"] = gr.Button("❚❚ Pause", size="sm", elem_id="tt-pause", min_width=70,
                                    interactive=first["visible"])
            ui["speed"] = gr.Dropdown(list(SPEEDS), value="2 steps/s", label="Replay speed", container=False,
                                      show_label=False, min_width=110, elem_id="tt-speed", elem_classes=["tt-speed"])
        # numbered from 1, as Status counts them: "step 3 of 6 engine steps" is the slider at 3. The box
        # beside it takes any number (clamped, with a word in Status): the slider's own number box, hidden,
        # refuses one past its ends with a red "Error" toast on every panel
        with gr.Row(equal_height=True, elem_id="tt-step-row"):
            ui["step"] = gr.Slider(step=1, elem_id="tt-step", scale=6, **first)
            ui["step_box"] = gr.Number(value=first["value"], precision=0, label="go to step", elem_id="tt-step-box",
                                       scale=1, min_width=90, interactive=bool(first["interactive"]),
                                       visible=first["visible"])
            ui["step_note"] = gr.HTML(note, elem_id="tt-step-note", padding=False, visible=not first["visible"])
        ui["replay_note"] = gr.HTML("", elem_id="tt-replay-note", padding=False)
        ui["class_links"] = gr.HTML("", elem_id="tt-class-links")


def _panel(ui: dict, name: str, blank) -> None:
    """One panel (and the pickers that belong to it) inside its stage's section."""
    elem = {"logit_lens": "tt-logit-lens"}.get(name, f"tt-{name}")
    if name == "attention":
        m = blank.model
        with gr.Row(elem_id="tt-attn-pickers"):
            ui["layer"] = gr.Dropdown(list(range(m["num_layers"])), value=0, label="Layer", elem_id="tt-layer")
            ui["head"] = gr.Dropdown(list(range(m["num_heads"])), value=0, label="Query head", elem_id="tt-head")
        ui[name] = gr.HTML(blank.render(name), elem_id=elem)
    elif name == "moe":
        with gr.Column(visible=blank.model["is_moe"], elem_id="tt-moe-col") as col:  # hidden: a dense model
            ui[name] = gr.HTML(blank.render(name), elem_id=elem)
        ui["moe_col"] = col
    elif name == "kv":
        ui[name] = gr.HTML(blank.render(name), elem_id=elem)
        with gr.Accordion("KV-cache size for reference models", open=False, elem_id="tt-calc-box"):
            with gr.Row():
                ui["calc_tokens"] = gr.Number(value=2000, precision=0, minimum=0, label="Context length (tokens)",
                                              elem_id="tt-calc-tokens")
                ui["calc_dtype"] = gr.Dropdown(list(viz.DTYPE_BYTES), value="float16", label="dtype")
            ui["calc"] = gr.HTML(viz.calculator_html(2000, "float16"), elem_id="tt-calc")
    else:
        ui[name] = gr.HTML(blank.render(name), elem_id=elem)
    if name == "sampling":  # a click on a candidate's token writes "TOKEN_ID:NONCE" here (hover.js)
        ui["pick_bias"] = gr.Textbox(elem_id="tt-pick-bias", elem_classes=["tt-hidden"], show_label=False,
                                     container=False)
    if name == "tokens":  # a click on a token chip writes "POS:NONCE" here (hover.js); a cell "LAYER:HEAD:NONCE"
        ui["pick"] = gr.Textbox(elem_id="tt-pick", elem_classes=["tt-hidden"], show_label=False, container=False)
        ui["pick_head"] = gr.Textbox(elem_id="tt-pick-head", elem_classes=["tt-hidden"], show_label=False,
                                     container=False)


def _stages(ui: dict, ctl: Controller) -> None:
    """One section per stage, in journey order: its sentence, then its panels."""
    blank = ctl.blank
    stages = {s.key: s for s in empty_stages(blank.model)}
    shown = {s.key: s for s in _shown_stages(ctl)}
    placed = section_panels(list(stages.values()), PANELS)
    for key in KEYS:
        st = shown.get(key) or stages.get(key)
        with gr.Column(elem_id=f"tt-stage-{key}", elem_classes=["tt-stage"],
                       visible=not (st.skipped if st else False)) as section:
            ui[f"stage:{key}"] = gr.HTML(stage_html(st) if st else "", elem_id=f"tt-stage-text-{key}",
                                         padding=False)
            ui[f"code:{key}"] = gr.HTML(code_views().get(key, ""), elem_id=f"tt-code-{key}",  # code_panel.py
                                        padding=False)
            for name in placed[key]:
                if name not in SIDEBAR:
                    _panel(ui, name, blank)
            if key == "prefix" and ctl.live:  # a second request that hits this one's blocks (second_request.py)
                ui["second"] = gr.Button(SECOND, size="sm", elem_id="tt-second-request")
        ui[f"section:{key}"] = section
    if "pick" not in ui:  # the token chips' pick box must exist even if no stage draws the tokens
        _panel(ui, "tokens", blank)


def _shown_stages(ctl: Controller) -> list:
    """The journey of what a tab shows when the page opens (a replay server: its file)."""
    try:
        return stages_of(ctl.blank)
    except Exception:  # noqa: BLE001 - the page still builds; the first update fills the stages
        return []


def build_page(served: ServedModels | EngineService | None, replay: Recording | None = None,
               classrooms: Classrooms | None = None, library=None) -> gr.Blocks:
    """served: the models to serve (the picker lists them); None: replay-only (no model
    loaded), showing `replay`."""
    ctl = Controller(served, replay, classrooms)
    ui: dict = {}
    with SkipBlocks(title="TokenTrace") as page:  # an update costs what it changes
        mode = "" if ctl.live else " <span class='tt-badge tt-miss'>REPLAY: no model loaded</span>"
        gr.HTML(f"<div class='tt-header'><h1>TokenTrace{mode}</h1><p>One request, every stage, drawn as it "
                f"happens.</p></div>", elem_id="tt-header", elem_classes=[language.TRANSLATED])
        ui["lang"] = language.switch()  # English / 中文 (language.py sets every tab's words)
        with gr.Tabs(elem_id="tt-tabs") as tabs:
            with gr.Tab("Journey", id="journey", elem_id="tt-tab-journey"):
                # the focus layout: a sticky sidebar (prompt, Send, the answer; then the settings and
                # the replay) beside a sticky map over every stage's section; a chip scrolls its
                # section to just under the map (focus.js)
                with gr.Row(equal_height=False, elem_id="tt-body"):
                    with gr.Column(scale=1, min_width=340, elem_id="tt-controls"):
                        _ask(ui, ctl)
                        _controls(ui, ctl)
                        _replay_bar(ui, ctl)
                    with gr.Column(scale=3, min_width=320, elem_id="tt-journey"):
                        ui["map"] = gr.HTML(map_html(_shown_stages(ctl), live=not ctl.live), elem_id="tt-map")
                        _stages(ui, ctl)
            build_lab_tab(ctl)
            shelf = build_library_tab(library) if library is not None else None
        _wire(page, ui, ctl)
        if shelf is not None:  # the Library tab's Open loads into the Journey tab, as Load does
            shelf.wire(Wiring(ui), api_outputs(ui), tabs, ctl.load_trace)
    return page


def api_outputs(ui: dict) -> list:
    """Every output of Send, Watch, Load and the replay, in the order the page's API published
    (new outputs go last: the API's outputs keep their positions)."""
    later = [n for n in PANELS if n in LATER_PANELS]
    early = [n for n in PANELS if n not in LATER_PANELS + NEWEST]
    names = early + ["status", "export", "step", "hint_prompt", "hint_send", "hint_max", "hint_sampling", "model_pick",
                     "summary", "note", "system", "user", "speculative", "k", "layer", "head", "moe_col",
                     "temperature", "top_k", "top_p", "max_tokens", "seed", "level"] \
        + later + ["export_timeline", "map"] + [f"stage:{k}" for k in KEYS] + [f"section:{k}" for k in KEYS] \
        + ["stop", "send", "unlock", "replay_note", "step_box"] + list(MORE) + ["hint_more", "choices", "step_note"] \
        + ["play", "pause"]
    return [ui[n] for n in names if n in ui]


def _wire(page: gr.Blocks, ui: dict, ctl: Controller) -> None:
    """Each event to its Controller method."""
    w = Wiring(ui)
    outputs = api_outputs(ui)
    quiet = {"api_visibility": "private", "show_progress": "hidden"}
    settings = SETTINGS + ("model",)
    journey_out = [ui["map"]] + [ui[f"stage:{k}"] for k in KEYS] + [ui[f"section:{k}"] for k in KEYS] \
        + [ui[n] for n in PANELS if n in ui] \
        + [ui[n] for n in ("summary", "note", "max_tokens", "speculative", "step", "step_note") if n in ui] \
        + [ui[f"code:{k}"] for k in KEYS if f"code:{k}" in ui]
    # the load sets the tab's language and its words, then the journey of what it shows (the switch: again,
    # and its panels in the new language)
    language.wire(page, ui["lang"], lambda key, panels: w.out(
        {**ctl.opening_page(key, panels), **(ctl.page_words(key) if panels else {})}, "map"), journey_out)
    if ctl.live:
        follow = w.gen(ctl.follow, ("layer", "head", "model"), client=True)
        watching = ui["watch"].click(follow, w.inputs(("layer", "head", "model")), outputs, concurrency_limit=16,
                                     **quiet)
        # input: the user's own pick (not the value Watch or Load write when they show another model)
        ui["model"].input(w.fn(ctl.pick_model, ("model",) + SETTINGS), w.inputs(("model",) + SETTINGS), outputs,
                          concurrency_limit=None, cancels=[watching], **quiet)
        run = w.gen(ctl.run, SEND_INPUTS, client=True)
        # sending from this tab ends its watching: one request per set of panels. "multiple": a Send while
        # one streams reaches run(), which refuses it visibly (Gradio's default drops it unseen)
        ui["send"].click(run, w.inputs(SEND_INPUTS), outputs, api_name="send", concurrency_limit=16,
                         show_progress="hidden", cancels=[watching], trigger_mode="multiple")
        ui["user"].submit(run, w.inputs(SEND_INPUTS), outputs, concurrency_limit=16, cancels=[watching],
                          trigger_mode="multiple", **quiet)
        second = w.gen(partial(send_second, ctl), SEND_INPUTS, client=True)
        ui["second"].click(second, w.inputs(SEND_INPUTS), outputs, concurrency_limit=16, cancels=[watching], **quiet)

        ui["stop"].click(w.fn(ctl.stop), None, [ui[n] for n in ("status",) + SETTINGS + ("send", "unlock", "stop")],
                         concurrency_limit=None, cancels=[watching], api_name="stop")
        ui["unlock"].click(w.fn(ctl.unlock, settings), w.inputs(settings), outputs, concurrency_limit=None, **quiet)
        # before any request, the body preview follows every edit of the user's (typed or pasted): input,
        # not change, so the values Watch and Load write fire nothing (each would be a round trip)
        for name in SETTINGS:
            ui[name].input(w.fn(ctl.preview, settings, keep="request"), w.inputs(settings), ui["request"],
                           concurrency_limit=None, trigger_mode="always_last", **quiet)
        wire_samples(ui).then(w.fn(ctl.preview, settings, keep="request"), w.inputs(settings), ui["request"],
                              concurrency_limit=None, **quiet)  # a sample picked: the body preview follows
    selected = [ui[n] for n in Controller.SELECTED] + journey_out  # the stages' words name the pass too
    ui["pick"].change(w.fn(ctl.pick_token, ("layer", "head"), extra=1, keep="attention"),
                      [ui["pick"], ui["layer"], ui["head"]], selected, concurrency_limit=None, **quiet)
    ui["pick_bias"].change(w.fn(ctl.pick_bias, ("bias",), extra=1, keep="bias"), [ui["pick_bias"], ui["bias"]],
                           [ui[n] for n in ("bias_token", "bias", "more_box", "hint_more")], concurrency_limit=None,
                           **quiet)
    ui["pick_head"].change(w.fn(ctl.pick_head, extra=1, keep="attention"), [ui["pick_head"]],
                           [ui["layer"], ui["head"], ui["attention"], ui["moe"]] + journey_out, concurrency_limit=None,
                           **quiet)
    for picker in ("layer", "head"):
        ui[picker].input(w.fn(ctl.redraw, ("layer", "head")), w.inputs(("layer", "head")),
                         [ui["attention"], ui["moe"]] + journey_out, concurrency_limit=None, **quiet)
    # input: the user's own moves (mouse or keyboard), not the values Play writes; always_last coalesces a drag
    for control in (ui["step"], ui["step_box"]):
        control.input(w.fn(ctl.goto, ("layer", "head"), extra=1), [control, ui["layer"], ui["head"]], outputs,
                      concurrency_limit=None, trigger_mode="always_last", **quiet)
    playing = ui["play"].click(w.gen(ctl.play, ("layer", "head"), extra=2),
                               [ui["step"], ui["speed"], ui["layer"], ui["head"]], outputs, concurrency_limit=None,
                               **quiet)
    ui["pause"].click(w.fn(ctl.paused), None, ui["status"], cancels=[playing], concurrency_limit=None, **quiet)
    ui["load"].upload(w.fn(lambda key, file: ctl.load_trace(key, getattr(file, "name", file)), extra=1),
                      [ui["load"]], outputs, concurrency_limit=None, **quiet)
    ui["class_btn"].click(w.fn(ctl.start_classroom, keep="class_links"), None, ui["class_links"],
                          concurrency_limit=None, **quiet)

    def calculator(tokens, dtype, request: gr.Request):  # in the tab's language
        return viz.calculator_html(int(tokens or 0), dtype, lang=lang_of(key_of(request)))

    ui["calc_tokens"].change(calculator, [ui["calc_tokens"], ui["calc_dtype"]], ui["calc"], api_name="kv_calculator",
                             concurrency_limit=None)
    ui["calc_dtype"].change(calculator, [ui["calc_tokens"], ui["calc_dtype"]], ui["calc"], api_visibility="private",
                            concurrency_limit=None)
