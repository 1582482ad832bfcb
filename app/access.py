"""Who may use the server: an access token on our own routes, a login on the page, and
errors that never show a stack trace.

The token (--api-key or TOKENTRACE_API_KEY) is sent the way OpenAI clients send theirs,
`Authorization: Bearer KEY`; a browser's WebSocket cannot set headers, so /ws also takes
`?api_key=KEY`. /healthz stays open for load balancers. The page has Gradio's own login:
the --auth user:password pairs, or any user name with the token as the password.
"""
from __future__ import annotations

import hmac
import logging
from typing import Callable
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocketClose

from app.limits import ServeLimits

log = logging.getLogger("tokentrace")
PROTECTED = ("/v1/", "/ws", "/metrics", "/classroom")  # "/classroom" exactly (making a room); rooms' pages are open


def _protected(path: str) -> bool:
    return path.startswith(PROTECTED[0]) or path in PROTECTED[1:]


def _same(given: str | None, key: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), key.encode())


class TokenCheck:
    """ASGI middleware: our routes answer 401 (a WebSocket: refused handshake) without the token."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self.key = app, api_key

    def _allowed(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.lower().startswith("bearer ") and _same(auth[7:].strip(), self.key):
            return True
        if scope["type"] == "websocket":
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            return _same((query.get("api_key") or [None])[0], self.key)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and _protected(scope["path"]) and not self._allowed(scope):
            if scope["type"] == "websocket":
                await WebSocketClose(code=1008)(scope, receive, send)  # before accept: HTTP 403
            else:
                await JSONResponse({"error": {
                    "message": "missing or wrong access token: send Authorization: Bearer <key>",
                    "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}},
                    401)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def add_access_control(api: FastAPI, limits: ServeLimits) -> None:
    if limits.api_key:
        api.add_middleware(TokenCheck, api_key=limits.api_key)

    @api.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The trace goes to the server log; the client gets the OpenAI shape, never the trace.
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        detail = "" if limits.public else f": {type(exc).__name__}: {exc}"
        return JSONResponse({"error": {"message": f"internal server error{detail}", "type": "server_error",
                                       "param": None, "code": None}}, 500)


def page_login(limits: ServeLimits) -> Callable[[str, str], bool] | None:
    """Gradio's `auth=` for the page, or None when no login is asked for."""
    if not limits.page_auth and not limits.api_key:
        return None
    pairs = dict(limits.page_auth)

    def check(user: str, password: str) -> bool:
        if user in pairs and _same(password, pairs[user]):
            return True
        return bool(limits.api_key) and _same(password, limits.api_key)
    return check
