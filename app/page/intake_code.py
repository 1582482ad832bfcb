"""The app's part of the request stage's code: how a body reaches the engine, beside
engine/code_map.py (which never names app/: the engine imports nothing of it). Data, in the
map's own form (engine's `Code`), resolved here by the same resolver, so the page shows these
functions from the running checkout as it shows the engine's; tests/app/page/test_intake_code.py
fails when one moves, is renamed or is deleted and this map does not follow.

Two ways in: an HTTP request (POST /v1/chat/completions or /v1/completions, or a /ws frame:
its id "chatcmpl-…" / "cmpl-…") or the page's Send (its id "req-…", the body built from the
controls); both go through the same body model and checks (app/serving/requests.py parse_body)."""
from __future__ import annotations

from engine import Code
from visualizers.i18n import N_

PATHS = {  # N_: in the catalogs (the stage's "ran" line says them in the tab's language)
    "http": N_("an HTTP request (POST /v1/chat/completions, /v1/completions, or a /ws frame): the body read and "
               "checked"),
    "page": N_("the page's Send: the controls written as the same JSON body, then the same checks"),
}

INTAKE_CODE: tuple[Code, ...] = (
    Code("app.api.openai_routes:_complete", "the route: the body read (refused past the size limit), checked, "
         "submitted to the engine's thread; its tokens written back", path="http",
         marks=("service, sub = prepare(models, body, endpoint)",)),
    Code("app.api.openai_routes:prepare", "the checks every way in applies: a served model, the body's fields, "
         "the server's max_tokens cap", path="http"),
    Code("app.serving.requests:build_body", "the page's controls as the JSON body an OpenAI client would send",
         path="page"),
    Code("app.serving.requests:parse_body", "the body model validates each field's type and range (pydantic), "
         "then the rules across fields: nothing malformed reaches the engine",
         marks=("req = MODELS[endpoint].model_validate(body)",)),
)


def intake_way(request_id: str) -> str:
    """The way this request came in, by its id (app/api makes "chatcmpl-…" and "cmpl-…")."""
    return "http" if request_id.startswith(("chatcmpl-", "cmpl-")) else "page" if request_id else ""
