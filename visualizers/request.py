"""Stage 1: the request as JSON, and what validation said about it."""
from __future__ import annotations

import json

from visualizers import i18n
from visualizers._html import esc, panel, said_html
from visualizers.request_checks import check_detail, check_name


def request_html(body: dict, validation: dict | None, preview: bool = False, lang: str = i18n.DEFAULT) -> str:
    """body: the OpenAI-style request body. validation: {"ok", "request_id", "error", "checks"}
    where checks is a list of (name, passed, detail); passed None: passed with a warning (a
    trace its byte cap cut). preview: nothing is sent yet; the body
    is what Send would post with the controls as they are."""
    pretty = esc(json.dumps(body, indent=2, ensure_ascii=False))
    if preview:
        verdict = ('<div class="tt-pending tt-preview">' + said_html(lang, "not sent yet: the body Send will post, as "
                                                                           "the controls are set now") + '</div>')
    elif validation is None:
        verdict = '<div class="tt-pending">' + said_html(lang, "validating…") + '</div>'
    elif validation.get("ok"):
        rid = f'<code>{esc(validation.get("request_id", ""))}</code>'
        verdict = '<div class="tt-ok">' + said_html(lang, "✓ valid — request id {id}", id=rid) + '</div>'
    else:  # the API's reason stays as the API gave it (English): the words around it are the page's
        reason = esc(validation.get("error", ""))
        verdict = '<div class="tt-err">' + said_html(lang, "✗ rejected: {reason}", reason=reason) + '</div>'
    marks = {True: ("tt-ok", "✓"), False: ("tt-err", "✗"), None: ("tt-warn", "⚠")}  # None: passed, with a warning
    colon = i18n.gettext(lang, ": ")
    checks = "".join(
        f'<li class="{marks[ok][0]}">{marks[ok][1]} {esc(check_name(lang, name))}'
        f'{colon + esc(check_detail(lang, detail, ok)) if detail else ""}</li>'
        for name, ok, detail in (validation or {}).get("checks", []))
    return panel(i18n.gettext(lang, "Request"), f'<pre class="tt-json">{pretty}</pre>{verdict}<ul class="tt-checks">{checks}</ul>')
