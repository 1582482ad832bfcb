"""Stage 1: the request as JSON, and what validation said about it."""
from __future__ import annotations

import json

from visualizers._html import esc, panel


def request_html(body: dict, validation: dict | None, preview: bool = False) -> str:
    """body: the OpenAI-style request body. validation: {"ok", "request_id", "error", "checks"}
    where checks is a list of (name, passed, detail); passed None: passed with a warning (a
    trace its byte cap cut). preview: nothing is sent yet; the body
    is what Send would post with the controls as they are."""
    pretty = esc(json.dumps(body, indent=2, ensure_ascii=False))
    if preview:
        verdict = ('<div class="tt-pending tt-preview">not sent yet: the body Send will post, as the controls are '
                   'set now</div>')
    elif validation is None:
        verdict = '<div class="tt-pending">validating…</div>'
    elif validation.get("ok"):
        verdict = (f'<div class="tt-ok">✓ valid — request id <code>{esc(validation.get("request_id", ""))}</code>'
                   '</div>')
    else:
        verdict = f'<div class="tt-err">✗ rejected: {esc(validation.get("error", ""))}</div>'
    marks = {True: ("tt-ok", "✓"), False: ("tt-err", "✗"), None: ("tt-warn", "⚠")}  # None: passed, with a warning
    checks = "".join(
        f'<li class="{marks[ok][0]}">{marks[ok][1]} {esc(name)}{": " + esc(detail) if detail else ""}</li>'
        for name, ok, detail in (validation or {}).get("checks", []))
    return panel("Request", f'<pre class="tt-json">{pretty}</pre>{verdict}<ul class="tt-checks">{checks}</ul>')
