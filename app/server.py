"""The one web server: FastAPI with the Gradio page mounted at "/". Routes of our own
(health now; the OpenAI API, /ws and trace export next) are registered before the mount."""
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # nothing leaves the machine

import gradio as gr  # noqa: E402
from fastapi import FastAPI  # noqa: E402

from app.access import add_access_control, page_login  # noqa: E402
from app.engine_service import EngineService  # noqa: E402
from app.events_api import add_event_routes  # noqa: E402
from app.metrics import add_metrics_route  # noqa: E402
from app.openai_api import add_openai_routes  # noqa: E402
from app.page import CSS, build_page  # noqa: E402


def create_app(service: EngineService) -> FastAPI:
    api = FastAPI(title="TokenTrace")

    @api.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok" if service.error is None else "degraded", "model": service.model_name,
                "error": service.error}

    add_access_control(api, service.limits)  # token on our routes; no stack traces in errors
    add_openai_routes(api, service)
    add_event_routes(api, service)
    add_metrics_route(api, service)
    page = build_page(service)
    # A built-in theme with system fonts: GoogleFont would fetch from the internet.
    theme = gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"],
                              font_mono=["ui-monospace", "monospace"])
    return gr.mount_gradio_app(api, page, path="/", css=CSS, theme=theme, footer_links=["api"],
                               auth=page_login(service.limits), show_error=not service.limits.public)
