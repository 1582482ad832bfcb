"""The Gradio page: controls on the left, one panel per stage of the request.

Send runs a generator in a worker thread: it submits the request to the engine
service and yields only the panels whose inputs changed, every 0.1 s at most, as
HTML (gr.Plot streaming falls behind and leaks browser memory; HTML does not).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from pathlib import Path

import gradio as gr

import visualizers as viz
from app.engine_service import EngineService
from app.live_view import PANELS, LiveView
from app.requests import TRACE_LEVELS, build_body, parse_body

CSS = (Path(__file__).with_name("page.css")).read_text()
YIELD_EVERY = 0.1  # seconds between updates sent to the browser while streaming
MAX_SESSIONS = 64


class Sessions:
    """Each browser tab's current view, by Gradio session hash (bounded, oldest out)."""

    def __init__(self) -> None:
        self._views: OrderedDict[str, LiveView] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, key: str, view: LiveView) -> None:
        with self._lock:
            self._views[key] = view
            self._views.move_to_end(key)
            while len(self._views) > MAX_SESSIONS:
                self._views.popitem(last=False)

    def get(self, key: str) -> LiveView | None:
        with self._lock:
            return self._views.get(key)


def _key(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "default"


def model_summary(m: dict) -> str:
    moe = f"MoE: {m['num_experts']} experts, top-{m['top_k']}, {len(m['moe_layers'])} MoE layers · " if m["is_moe"] \
        else "dense FFN · "
    draft = f"draft model on, k≤{m['num_speculative_tokens']}" if m["has_draft"] else "no draft model"
    return (f"<div class='tt-model'><b>{viz._html.esc(m['name'])}</b> · {m['num_layers']} layers · d_model "
            f"{m['hidden_size']} · {m['num_heads']} query heads / {m['num_kv_heads']} KV heads × {m['head_dim']} · "
            f"vocab {m['vocab_size']:,} · {moe}{draft} · {viz._html.esc(m['dtype'])} on {viz._html.esc(m['device'])} · "
            f"KV pool {m['num_blocks']:,} blocks × {m['block_size']} tokens "
            f"({viz._html.esc(viz._html.fmt_bytes(m['kv_cache_bytes']))})</div>")


def build_page(service: EngineService) -> gr.Blocks:
    m = service.model_info()
    sessions = Sessions()

    def new_view() -> LiveView:
        return LiveView(model=m, piece=service.piece, is_special=service.is_special)

    blank = new_view()
    blank.body = build_body(m["name"], "", "", 0.8, 0, 1.0, 64, None, True, m["num_speculative_tokens"], "full")

    with gr.Blocks(title="TokenTrace") as page:
        gr.HTML(f"<div class='tt-header'><h1>TokenTrace</h1><p>One request, every stage, drawn as it happens."
                f"</p>{model_summary(m)}</div>")
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=300, elem_id="tt-controls"):
                system = gr.Textbox(label="System prompt", lines=2, value="You are a helpful assistant.",
                                    elem_id="tt-system")
                user = gr.Textbox(label="User prompt", lines=3, value="Tell me a short story about a fox.",
                                  elem_id="tt-user")
                with gr.Row():
                    send = gr.Button("Send", variant="primary", elem_id="tt-send")
                    stop = gr.Button("Stop", variant="stop", elem_id="tt-stop")
                status = gr.Textbox(label="Status", interactive=False, elem_id="tt-status")
                temperature = gr.Slider(0, 2, value=0.8, step=0.05, label="Temperature (0 = greedy)")
                top_k = gr.Slider(0, min(200, m["vocab_size"]), value=0, step=1, label="Top-k (0 = off)")
                top_p = gr.Slider(0.05, 1, value=0.95, step=0.01, label="Top-p (1 = off)")
                max_tokens = gr.Slider(1, 512, value=48, step=1, label="Max tokens", elem_id="tt-max-tokens")
                seed = gr.Number(value=None, precision=0, label="Seed (empty = random)")
                with gr.Row():
                    speculative = gr.Checkbox(value=m["has_draft"], interactive=m["has_draft"],
                                              label="Speculative decoding" + ("" if m["has_draft"] else
                                                                              " (no draft model loaded)"))
                    k = gr.Slider(1, max(1, m["num_speculative_tokens"]), value=m["num_speculative_tokens"],
                                  step=1, label="Draft tokens k", interactive=m["has_draft"])
                level = gr.Radio(list(TRACE_LEVELS), value="full", label="Capture level",
                                 info="full: tensors (embeddings, attention, MoE); basic: no tensors")
            with gr.Column(scale=3):
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
        outputs = [panels[n] for n in PANELS] + [status]

        def full(view: LiveView, state: str) -> dict:
            now = time.perf_counter()
            return {**{panels[n]: h for n, h in view.draw(list(PANELS), now).items()}, status: state}

        def run(system_text, user_text, temp, topk, topp, max_tok, seed_value, spec_on, k_value, level_value,
                layer_value, head_value, request: gr.Request):
            view = new_view()
            view.layer, view.head = int(layer_value or 0), int(head_value or 0)
            view.speculative = bool(spec_on)
            view.body = build_body(m["name"], system_text or "", user_text or "", float(temp), int(topk),
                                   float(topp), int(max_tok), None if seed_value is None else int(seed_value),
                                   bool(spec_on) and m["has_draft"], int(k_value), level_value)
            sessions.put(_key(request), view)
            submission = None
            try:
                submission = parse_body(view.body)
                watch = service.submit(submission)  # the engine's own checks: context, KV pool, vocabulary
            except ValueError as e:
                checks = getattr(e, "checks", None) or submission.checks + [("engine", False, str(e))]
                view.validation = {"ok": False, "error": str(e), "checks": checks}
                view.error = f"not sent: {e}"
                yield full(view, f"rejected: {e}")
                return
            view.request_id = watch.request_id
            view.validation = {"ok": True, "request_id": watch.request_id, "checks": submission.checks + [
                ("engine", True, f"accepted; fits the context of {m['max_model_len']:,} tokens and the KV pool")]}
            view.set_snapshot(service.snapshot.as_dict if service.snapshot else None)
            try:
                yield full(view, f"{watch.request_id}: queued")
                last = time.perf_counter()
                while not view.finished:
                    view.add(watch.drain(YIELD_EVERY / 2))
                    if service.snapshot is not None:
                        view.set_snapshot(service.snapshot.as_dict)
                    now = time.perf_counter()
                    if now - last >= YIELD_EVERY and not view.finished:
                        names = view.due(now)
                        if names:
                            n_out = len(view.generated_ids())
                            yield {**{panels[n]: h for n, h in view.draw(names, now).items()},
                                   status: f"{watch.request_id}: streaming, {n_out} tokens"}
                            last = now
                view.add(watch.drain(0))
                if service.snapshot is not None:
                    view.set_snapshot(service.snapshot.as_dict)
                fin = view.first("finish")
                reason = fin["reason"] if fin else next(
                    (o["finish_reason"] for o in view.outputs if o["finished"]), "?")
                now = time.perf_counter()  # the last tokens first, then every panel's final state
                yield {panels["answer"]: view.draw(["answer"], now)["answer"],
                       status: f"{watch.request_id}: streaming, {len(view.generated_ids())} tokens"}
                yield full(view, f"{watch.request_id}: finished ({reason}), {len(view.generated_ids())} tokens")
            finally:
                service.unsubscribe(watch)
                if not view.finished:  # tab closed or event cancelled: free the engine's work
                    threading.Thread(target=service.abort, args=(watch.request_id,), daemon=True).start()

        def stop_request(request: gr.Request):
            view = sessions.get(_key(request))
            if view is not None and view.request_id and not view.finished:
                service.abort(view.request_id)

        def redraw(layer_value, head_value, request: gr.Request):
            view = sessions.get(_key(request)) or blank
            view.layer, view.head = int(layer_value or 0), int(head_value or 0)
            return view.render("attention"), view.render("moe")

        inputs = [system, user, temperature, top_k, top_p, max_tokens, seed, speculative, k, level, layer, head]
        send.click(run, inputs, outputs, api_name="send", concurrency_limit=16, show_progress="hidden")
        user.submit(run, inputs, outputs, api_visibility="private", concurrency_limit=16,
                    show_progress="hidden")
        stop.click(stop_request, None, None, api_name="stop", concurrency_limit=None)
        for picker in (layer, head):
            picker.change(redraw, [layer, head], [out_attention, out_moe], api_visibility="private",
                          concurrency_limit=None, show_progress="hidden")
        def calculator(tokens, dtype):
            return viz.calculator_html(int(tokens or 0), dtype)

        calc_tokens.change(calculator, [calc_tokens, calc_dtype], out_calc, api_name="kv_calculator",
                           concurrency_limit=None)
        calc_dtype.change(calculator, [calc_tokens, calc_dtype], out_calc, api_visibility="private",
                          concurrency_limit=None)
    return page
