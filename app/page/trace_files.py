"""A recording written for the page's download buttons: the trace as JSON (load it again, or
replay it with --replay), and its timeline as Chrome trace-event JSON."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from app.serving.recording import Recording
from visualizers.perfetto import perfetto_trace


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
