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

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocketClose

from app.serving.limits import ServeLimits

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


class HideErrors:
    """ASGI middleware: an unexpected exception becomes a 500 in OpenAI's shape; the trace
    goes to the server log only. (Starlette's own handler re-raises, and uvicorn then drops
    the keep-alive connection under the client's next request.)"""

    def __init__(self, app: ASGIApp, public: bool) -> None:
        self.app, self.public = app, public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watch_start(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)
        try:
            await self.app(scope, receive, watch_start)
        except Exception as exc:
            log.exception("unexpected error in %s %s", scope.get("method"), scope.get("path"))
            if started:  # too late for a status: the server closes the stream
                raise
            detail = "" if self.public else f": {type(exc).__name__}: {exc}"
            await JSONResponse({"error": {"message": f"internal server error{detail}", "type": "server_error",
                                          "param": None, "code": None}}, 500)(scope, receive, send)


def add_access_control(api: FastAPI, limits: ServeLimits) -> None:
    api.add_middleware(HideErrors, public=limits.public)
    if limits.api_key:  # added last, so it runs first
        api.add_middleware(TokenCheck, api_key=limits.api_key)


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
