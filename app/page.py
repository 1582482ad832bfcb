"""The Gradio page: controls on the left, one panel per stage of the request.

Send runs a generator in a worker thread: it submits the request to the engine
service and yields only the panels whose inputs changed, every 0.1 s at most, as
HTML (gr.Plot streaming falls behind and leaks browser memory; HTML does not).
Watch follows requests sent by others (curl, the SDK, other tabs) the same way.
A finished request becomes a recording: export it, load one, scrub or play it
step by step, or open it in classroom mode. With no engine (`--replay FILE`) the
page only replays.
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


def model_summary(m: dict) -> str:
    moe = f"MoE: {m['num_experts']} experts, top-{m['top_k']}, {len(m['moe_layers'])} MoE layers · " if m["is_moe"] \
        else "dense FFN · "
    draft = f"draft model on, k≤{m['num_speculative_tokens']}" if m["has_draft"] else "no draft model"
    return (f"<div class='tt-model'><b>{viz._html.esc(m['name'])}</b> · {m['num_layers']} layers · d_model "
            f"{m['hidden_size']} · {m['num_heads']} query heads / {m['num_kv_heads']} KV heads × {m['head_dim']} · "
            f"vocab {m['vocab_size']:,} · {moe}{draft} · {viz._html.esc(m['dtype'])} on {viz._html.esc(m['device'])} · "
            f"KV pool {m['num_blocks']:,} blocks × {m['block_size']} tokens "
            f"({viz._html.esc(viz._html.fmt_bytes(m['kv_cache_bytes']))})</div>")


def build_page(service: EngineService | None, replay: Recording | None = None,
               classrooms: Classrooms | None = None) -> gr.Blocks:
    """service None: replay-only (no model loaded), showing `replay`."""
    m = service.model_info() if service is not None else replay.model
    m = {"num_experts": 0, "top_k": 0, "moe_layers": [], "sliding_windows": [], "has_draft": False,
         "num_speculative_tokens": 1, "max_model_len": 0, "device": "-", **m}
    sessions = Sessions()
    classrooms = classrooms or Classrooms()
    live = service is not None

    def new_view() -> LiveView:
        return LiveView(model=m, piece=service.piece, is_special=service.is_special)

    if live:
        blank = new_view()
        blank.body = build_body(m["name"], "", "", 0.8, 0, 1.0, 64, None, True, m["num_speculative_tokens"], "full")
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
                f"happens.</p>{model_summary(m)}</div>")
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=300, elem_id="tt-controls"):
                system = gr.Textbox(label="System prompt", lines=2, value="You are a helpful assistant.",
                                    elem_id="tt-system", interactive=live)
                user = gr.Textbox(label="User prompt", lines=3, value="Tell me a short story about a fox.",
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
                cap = service.limits.max_tokens_cap if live and service.limits.max_tokens_cap else 512
                max_tokens = gr.Slider(1, cap, value=min(48, cap), step=1, label=f"Max tokens (≤ {cap})",
                                       elem_id="tt-max-tokens")
                hint_max = gr.HTML("", elem_id="tt-hint-max-tokens", padding=False, elem_classes=["tt-hint-box"])
                seed = gr.Number(value=None, precision=0, label="Seed (empty = random)", elem_id="tt-seed")
                hint_sampling = gr.HTML("", elem_id="tt-hint-sampling", padding=False, elem_classes=["tt-hint-box"])
                with gr.Row():
                    speculative = gr.Checkbox(value=m["has_draft"], interactive=m["has_draft"],
                                              label="Speculative decoding" + ("" if m["has_draft"] else
                                                                              " (no draft model loaded)"))
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
        with gr.Row(equal_height=False):
            with gr.Column(scale=1):
                out_embedding = gr.HTML(blank.render("embedding"), elem_id="tt-embedding")
            with gr.Column(scale=1):
                with gr.Row():
                    layer = gr.Dropdown(list(range(m["num_layers"])), value=0, label="Layer", elem_id="tt-layer")
                    head = gr.Dropdown(list(range(m["num_heads"])), value=0, label="Query head", elem_id="tt-head")
                out_attention = gr.HTML(blank.render("attention"), elem_id="tt-attention")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                out_kv = gr.HTML(blank.render("kv"), elem_id="tt-kv")
            with gr.Column(scale=2):
                gr.HTML("<div class='tt-title'>KV-cache size for reference models</div>")
                with gr.Row():
                    calc_tokens = gr.Number(value=2000, precision=0, minimum=0, label="Context length (tokens)",
                                            elem_id="tt-calc-tokens")
                    calc_dtype = gr.Dropdown(list(viz.DTYPE_BYTES), value="float16", label="dtype")
                out_calc = gr.HTML(viz.calculator_html(2000, "float16"), elem_id="tt-calc")
        with gr.Row(equal_height=False):
            out_moe = gr.HTML(blank.render("moe"), elem_id="tt-moe")
            out_sampling = gr.HTML(blank.render("sampling"), elem_id="tt-sampling")
        out_spec = gr.HTML(blank.render("spec"), elem_id="tt-spec")

        panels = {"request": out_request, "prefix": out_prefix, "tokens": out_tokens, "embedding": out_embedding,
                  "attention": out_attention, "kv": out_kv, "moe": out_moe, "sampling": out_sampling,
                  "spec": out_spec, "answer": out_answer, "timeline": out_timeline}
        hints = {"messages": hint_prompt, "max_tokens": hint_max, "temperature": hint_sampling,
                 "top_k": hint_sampling, "top_p": hint_sampling, "seed": hint_sampling}
        hint_boxes = [hint_prompt, hint_send, hint_max, hint_sampling]
        outputs = [panels[n] for n in PANELS] + [status, export, step] + hint_boxes

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
            view = tab.view
            rec = record_request(service.store, view.request_id, m, service.piece, service.is_special) \
                if view.request_id else None
            extra = {export: gr.update(value=None, interactive=False), step: gr.update(maximum=1, value=0)}
            if rec is not None:
                tab.cursor = ReplayCursor(rec)
                tab.cursor.adopt(view)  # the live view already shows the last frame
                extra = {export: gr.update(value=write_trace(rec), interactive=True),
                         step: gr.update(maximum=max(1, tab.cursor.last_frame), value=tab.cursor.last_frame)}
            return {**full(view, final), **extra}

        def stream(tab: Tab, next_items: Callable[[float], list[dict]]) -> Iterator[dict]:
            """Feed the view from next_items until its request finishes, yielding due panels."""
            view, rid = tab.view, tab.view.request_id
            view.set_snapshot(service.snapshot.as_dict if service.snapshot else None)
            yield full(view, f"{rid}: queued")
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
                layer_value, head_value, request: gr.Request):
            view = new_view()
            view.layer, view.head = int(layer_value or 0), int(head_value or 0)
            view.speculative = bool(spec_on)
            view.body = build_body(m["name"], system_text or "", user_text or "", float(temp), int(topk),
                                   float(topp), int(max_tok), None if seed_value is None else int(seed_value),
                                   bool(spec_on) and m["has_draft"], int(k_value), level_value)
            tab = Tab(view)
            sessions.put(_key(request), tab)
            submission = None
            try:
                submission = parse_body(view.body, service.limits.max_tokens_cap)
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
                ("engine", True, f"accepted; fits the context of {m['max_model_len']:,} tokens and the KV pool")]}
            try:
                yield {h: "" for h in hint_boxes}  # the last request's complaints are gone
                yield from stream(tab, watch.drain)
            finally:
                service.unsubscribe(watch)
                if not view.finished:  # tab closed or event cancelled: free the engine's work
                    threading.Thread(target=service.abort, args=(watch.request_id,), daemon=True).start()

        def follow(layer_value, head_value, request: gr.Request):
            """Show every request sent by someone else (curl, SDK, another tab), one after another."""
            fire = service.subscribe_all(max_items=20_000)
            arrivals: deque[str] = deque()

            def note_arrivals(timeout: float) -> None:
                for it in fire.drain(timeout):
                    if it["type"] == "request.arrive":
                        arrivals.append(it["request_id"])

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
                    rid = arrivals.popleft()
                    sub = service.subscribe(rid)
                    try:
                        tr = service.store.trace(rid)
                        if tr is None:
                            continue
                        view = new_view()
                        view.layer, view.head = int(layer_value or 0), int(head_value or 0)
                        show_accepted(view, rid, tr.body, "accepted (sent by another client)")
                        backfill = sorted(tr.events + tr.outputs, key=lambda i: i["step"])
                        seen = {id(i) for i in backfill}
                        view.add(backfill)
                        tab = Tab(view, watched=True)
                        sessions.put(_key(request), tab)

                        def next_items(timeout: float) -> list[dict]:
                            note_arrivals(0)
                            return [i for i in sub.drain(timeout) if id(i) not in seen]

                        yield from stream(tab, next_items)
                    finally:
                        service.unsubscribe(sub)
                    waiting = f"{rid} finished · watching: waiting for the next request"
                    yield {status: waiting}
            finally:
                service.unsubscribe(fire)

        def stop_request(request: gr.Request):
            tab = sessions.get(_key(request))
            if tab is not None and not tab.watched and tab.view.request_id and not tab.view.finished:
                service.abort(tab.view.request_id)

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
            tab.cursor.view.layer, tab.cursor.view.head = int(layer_value or 0), int(head_value or 0)
            sessions.put(_key(request), tab)
            out = show_frame(tab, tab.cursor.last_frame, f" · loaded {Path(path).name}")
            return {**out, export: gr.update(value=write_trace(rec), interactive=True),
                    step: gr.update(maximum=max(1, tab.cursor.last_frame), value=tab.cursor.last_frame)}

        def start_classroom(request: gr.Request):
            tab = tab_of(request)
            rec = tab.cursor.rec if tab is not None and tab.cursor is not None else None
            refresh = None
            if rec is None and tab is not None and tab.view.request_id and live:  # still streaming: walk it live
                rid = tab.view.request_id
                refresh = lambda: record_request(service.store, rid, m, service.piece, service.is_special)  # noqa
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

        inputs = [system, user, temperature, top_k, top_p, max_tokens, seed, speculative, k, level, layer, head]
        if live:
            watching = watch_btn.click(follow, [layer, head], outputs, api_visibility="private",
                                       concurrency_limit=16, show_progress="hidden")
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
