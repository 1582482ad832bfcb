"""The page's Library tab: the recorded traces the server keeps (its database, or memory with
--db none), newest first. Search by the prompt's words, pick one, then open it in the Journey
tab to replay it step by step (no model needed: it is the file the engine recorded), export
it, pin it (the store's bounds never drop it) or delete it."""
from __future__ import annotations

import html
import time
from dataclasses import dataclass

import gradio as gr

from app.page.tabs import key_of
from app.page.trace_files import write_timeline, write_trace
from app.store.library import Library

SHOWN = 100  # traces the picker lists (the newest that match)


def _label(item: dict) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(item["created"]))
    pin = " · pinned" if item["pinned"] else ""
    return f"{when} · {item['model'] or '?'} · {item['tokens']} tokens · {item['capture_level'] or '?'}{pin} · " \
           f"{item['prompt'][:70] or '(no prompt)'}"


def _where(library: Library) -> str:
    h = library.health()
    if h["kind"] == "none":
        return "Traces are kept in memory only (<code>--db none</code>): they are gone when the server stops."
    where = html.escape(str(h["where"]))
    if not h["ok"]:
        return (f"<span class='tt-err' id='tt-lib-down'>The database ({where}) is unreachable: the list shows "
                f"what this server keeps in memory; writes resume when it is back "
                f"({h['pending']} queued).</span>")
    kind = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}.get(h["kind"], html.escape(h["kind"]))
    return f"Traces are kept in {kind} <code>{where}</code>: they last across restarts."


@dataclass
class LibraryTab:
    library: Library
    private: bool
    ui: dict

    def choices(self, query: str = "") -> tuple[list[tuple[str, str]], str]:
        if self.private:
            return [], "<span class='tt-err'>This public server keeps its library private (start it with --api-key).</span>"
        items, more = self.library.listed(SHOWN, None, query or "")
        note = f"{len(items)}{'+' if more else ''} trace{'s' if len(items) != 1 else ''}" + \
            (f" whose prompt holds {html.escape(query)!s}" if query.strip() else "")
        return [(_label(i), i["id"]) for i in items], f"{_where(self.library)} {note}."

    def refresh(self, query: str = "", keep: str | None = None) -> tuple:
        choices, note = self.choices(query)
        ids = [c[1] for c in choices]
        pick = keep if keep in ids else (ids[0] if ids else None)
        return gr.update(choices=choices, value=pick), note

    def export(self, rid: str | None) -> tuple:
        rec = self.library.recording(rid) if rid and not self.private else None
        if rec is None:
            return gr.update(value=None), gr.update(value=None), "pick a trace first"
        return write_trace(rec), write_timeline(rec), f"exported {html.escape(rid)}"

    def pin(self, rid: str | None, query: str) -> tuple:
        if not rid or self.private:
            return (*self.refresh(query), "pick a trace first")
        on = not self.library.is_pinned(rid)
        self.library.pin(rid, on)
        return (*self.refresh(query, rid), f"{'pinned' if on else 'unpinned'} {html.escape(rid)}")

    def delete(self, rid: str | None, query: str) -> tuple:
        if not rid or self.private:
            return (*self.refresh(query), "pick a trace first")
        gone = self.library.delete(rid)
        return (*self.refresh(query), f"deleted {html.escape(rid)}" if gone else f"{html.escape(rid)} was gone")

    def wire(self, wiring, outputs: list, tabs: gr.Tabs, load_trace) -> None:
        """Open loads the trace into the Journey tab (load_trace(key, path): the page's Load) and shows it."""
        ui, quiet = self.ui, {"api_visibility": "private", "show_progress": "hidden", "concurrency_limit": None}
        lists = [ui["pick"], ui["note"]]
        ui["search"].submit(self.refresh, [ui["search"]], lists, **quiet)
        ui["refresh"].click(self.refresh, [ui["search"]], lists, **quiet)
        ui["tab"].select(self.refresh, [ui["search"], ui["pick"]], lists, **quiet)
        ui["export"].click(self.export, [ui["pick"]], [ui["file"], ui["timeline"], ui["said"]], **quiet)
        ui["pin"].click(self.pin, [ui["pick"], ui["search"]], lists + [ui["said"]], **quiet)
        ui["delete"].click(self.delete, [ui["pick"], ui["search"]], lists + [ui["said"]], **quiet)

        def open_it(request: gr.Request, rid: str | None):
            rec = self.library.recording(rid) if rid and not self.private else None
            if rec is None:
                return {ui["said"]: "pick a trace first (or it was deleted)"}
            return {**wiring.out(load_trace(key_of(request), write_trace(rec))), tabs: gr.Tabs(selected="journey"),
                    ui["said"]: f"opened {html.escape(rid)} in the Journey tab"}
        ui["open"].click(open_it, [ui["pick"]], outputs + [tabs, ui["said"]], **quiet)


def build_library_tab(library: Library) -> LibraryTab:
    """The tab's components, inside the page's gr.Tabs (layout.py); wire() after the page's own wiring."""
    ui: dict = {}
    with gr.Tab("Library", id="library", elem_id="tt-tab-library") as ui["tab"]:
        tab = LibraryTab(library, library.private, ui)
        choices, note = tab.choices()
        ui["note"] = gr.HTML(note, elem_id="tt-lib-note", padding=False)
        with gr.Row():
            ui["search"] = gr.Textbox(label="Search the prompts (every word, any case; Enter)", max_lines=1,
                                      elem_id="tt-lib-search", scale=4)
            ui["refresh"] = gr.Button("Refresh", size="sm", elem_id="tt-lib-refresh", scale=1)
        ui["pick"] = gr.Dropdown(choices, value=choices[0][1] if choices else None, label="Trace",
                                 elem_id="tt-lib-pick", interactive=True)
        with gr.Row():
            ui["open"] = gr.Button("Open (replay in Journey)", variant="primary", elem_id="tt-lib-open")
            ui["export"] = gr.Button("Export", elem_id="tt-lib-export")
            ui["pin"] = gr.Button("Pin / unpin", elem_id="tt-lib-pin")
            ui["delete"] = gr.Button("Delete", variant="stop", elem_id="tt-lib-delete")
        ui["said"] = gr.HTML("", elem_id="tt-lib-said", padding=False)
        with gr.Row():
            ui["file"] = gr.File(label="Trace (JSON)", elem_id="tt-lib-file", interactive=False)
            ui["timeline"] = gr.File(label="Timeline (Perfetto JSON)", elem_id="tt-lib-timeline", interactive=False)
    return tab
