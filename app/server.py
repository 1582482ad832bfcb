"""The one web server: FastAPI with the Gradio page mounted at "/". Routes of our own
(health, the OpenAI API, /ws, traces, metrics, classroom) are registered before the mount."""
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # nothing leaves the machine

import gradio as gr  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi_offline import FastAPIOffline  # noqa: E402

from app.serving.access import add_access_control, page_login  # noqa: E402
from app.classroom.rooms import Classrooms  # noqa: E402
from app.classroom.routes import add_classroom_routes  # noqa: E402
from app.serving.engine_service import EngineService  # noqa: E402
from app.api.events import add_event_routes  # noqa: E402
from app.serving.limits import ServeLimits  # noqa: E402
from app.api.metrics import add_metrics_route  # noqa: E402
from app.api.openai_routes import add_fallback_routes, add_openai_routes  # noqa: E402
from app.api.library_routes import add_library_routes  # noqa: E402
from app.api.schemas import add_validation_errors  # noqa: E402
from app.page.lab_tab import add_lab_routes  # noqa: E402
from app.page.code_panel import add_code_routes  # noqa: E402
from app.page.layout import CSS, HEAD, build_page  # noqa: E402
from app.serving.recording import Recording, record_request  # noqa: E402
from app.serving.served_models import ServedModels  # noqa: E402
from app.store.library import Library  # noqa: E402


def create_app(served: EngineService | ServedModels | None, replay: Recording | None = None,
               limits: ServeLimits | None = None, library: Library | None = None,
               classrooms: Classrooms | None = None) -> FastAPI:
    """served: one engine or several (ServedModels); None: replay mode (`python -m app
    --replay FILE`): the page and classroom only. library: the traces' database (app/store;
    None: memory only). classrooms: the rooms (kept in the library's database by
    app.classroom.lasting; None: memory only)."""
    models = ServedModels.of(served) if served is not None else None
    limits = limits or (models.limits if models is not None else ServeLimits())
    library = library or Library(models.first.store if models is not None else None)
    library.private = limits.public and not limits.api_key  # the list would show every visitor's prompts
    # /docs from the package's own copy of Swagger UI: nothing fetched from a CDN, no call to Swagger's
    # online validator; no /redoc (ReDoc's bundle fetches from cdn.redoc.ly)
    api = FastAPIOffline(title="TokenTrace", redoc_url=None, swagger_ui_parameters={"validatorUrl": None})

    @api.get("/healthz")
    def healthz() -> dict:
        if models is None:
            return {"status": "ok", "model": None, "mode": "replay", "request_id": replay.request_id}
        return {"status": "ok" if models.error is None else "degraded", "model": models.first.model_name,
                "models": models.names, "error": models.error, "database": library.health()}

    add_access_control(api, limits)  # token on our routes; no stack traces in errors
    add_validation_errors(api)  # a bad query or path parameter: OpenAI's error shape too
    if models is not None:
        add_openai_routes(api, models)
        add_event_routes(api, models, library)
        add_metrics_route(api, models)
    add_library_routes(api, library, replay=models is None)
    add_fallback_routes(api, replay.request_id if models is None else None)  # after every /v1 route
    classrooms = classrooms if classrooms is not None else Classrooms()
    if models is not None:
        def in_memory(rid: str) -> Recording | None:
            service = models.owner(rid)  # whichever engine ran it
            return None if service is None else record_request(service.store, rid, service.model_info(),
                                                                service.piece, service.is_special)
        library.recorder = in_memory  # what the database's writer stores as a request ends

        def recorder(rid: str) -> Recording | None:
            return in_memory(rid) or library.recording(rid)
    else:
        def recorder(rid: str) -> Recording | None:
            return replay if rid == replay.request_id else library.recording(rid)
    add_classroom_routes(api, classrooms, CSS, recorder)
    add_lab_routes(api)  # plotly.js for the Experiments tab's and the classroom's figures
    add_code_routes(api)  # each stage's code view, fetched when it opens
    page = build_page(models, replay, classrooms, library)
    # A built-in theme with system fonts: GoogleFont would fetch from the internet.
    theme = gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"],
                              font_mono=["ui-monospace", "monospace"])
    # run_history off: Gradio would copy every streamed update (our panels, images included)
    # into the browser's localStorage, re-serialising its last 100 runs each time, which
    # made each update slower request after request (and kept visitors' prompts there).
    return gr.mount_gradio_app(api, page, path="/", css=CSS, head=HEAD, theme=theme, footer_links=["api"],
                               auth=page_login(limits), show_error=not limits.public, run_history=False)
