"""What one client may ask of a shared server: the serving limits set at start-up, the
per-client count of requests in flight, and the refusal a handler turns into a 4xx.

Public mode (--share, or a host other than loopback) turns on caps by default and
hides internals (file paths, exception text) from error messages.
"""
from __future__ import annotations

import ipaddress
import re
import threading
from dataclasses import dataclass, field

PUBLIC_MAX_TOKENS = 256  # defaults in public mode; a local server has no caps
PUBLIC_MAX_CONCURRENT = 2
MAX_BODY_BYTES = 1 << 20
API_TRACE_LEVEL = "basic"  # API requests that do not ask: every stage and token, no tensors (a few KB per token)


class RequestRefused(ValueError):
    """A request the server will not run now; `status` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.type = status, param, code, type_


@dataclass(frozen=True)
class ServeLimits:
    public: bool = False
    max_tokens_cap: int | None = None  # largest max_tokens one request may ask for
    max_concurrent_per_client: int | None = None  # requests in flight per client (IP address)
    max_body_bytes: int = MAX_BODY_BYTES
    api_key: str | None = None  # Bearer token required on /v1, /ws and /metrics
    page_auth: tuple[tuple[str, str], ...] = ()  # (user, password) pairs for the page's login
    api_trace_level: str = API_TRACE_LEVEL  # for API and /ws requests whose body has no trace_level
    ignore_unknown_fields: bool = False  # drop body fields the server does not implement, instead of a 400
    lab: bool = False  # --lab: the page's Experiments tab runs on a public server too (they build engines)

    @classmethod
    def for_server(cls, host: str, exposed: bool, max_tokens_cap: int | None = None,
                   max_concurrent_per_client: int | None = None, max_body_bytes: int | None = None,
                   api_key: str | None = None, page_auth: tuple[tuple[str, str], ...] = (),
                   api_trace_level: str = API_TRACE_LEVEL, ignore_unknown_fields: bool = False) -> "ServeLimits":
        """exposed: reachable from elsewhere though bound to loopback (--share, --public behind a proxy)."""
        public = exposed or not is_loopback(host)
        return cls(public=public,
                   max_tokens_cap=max_tokens_cap if max_tokens_cap is not None else
                   (PUBLIC_MAX_TOKENS if public else None),
                   max_concurrent_per_client=max_concurrent_per_client if max_concurrent_per_client is not None
                   else (PUBLIC_MAX_CONCURRENT if public else None),
                   max_body_bytes=max_body_bytes or MAX_BODY_BYTES, api_key=api_key or None,
                   page_auth=page_auth, api_trace_level=api_trace_level,
                   ignore_unknown_fields=ignore_unknown_fields)

    def shown(self, message: str) -> str:
        """An error message as a client may see it: in public mode without file paths."""
        return redact_paths(message) if self.public else message


def client_of(request) -> str | None:
    """Who counts against the per-client cap: the client's address (a Starlette or Gradio
    request, or a WebSocket). Behind a reverse proxy on this machine, uvicorn takes it from
    X-Forwarded-For."""
    client = getattr(request, "client", None)
    return getattr(client, "host", None)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[/\\][\w.\-@+~]+){2,}[/\\]?")


def redact_paths(message: str) -> str:
    return _PATH.sub("<path>", message)


@dataclass
class ClientSlots:
    """Requests in flight per client. acquire() refuses past the cap; release() is
    idempotent, so both the engine's finish and the handler's cleanup may call it."""
    limit: int | None = None
    _owner: dict[str, str] = field(default_factory=dict)  # request id -> client
    _count: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def acquire(self, client: str | None, request_id: str) -> None:
        if client is None or self.limit is None:
            return
        with self._lock:
            if self._count.get(client, 0) >= self.limit:
                raise RequestRefused(
                    f"too many requests in flight from this client (at most {self.limit} at once); "
                    "wait for one to finish", status=429, code="rate_limit_exceeded", type_="rate_limit_error")
            self._owner[request_id] = client
            self._count[client] = self._count.get(client, 0) + 1

    def release(self, request_id: str) -> None:
        with self._lock:
            client = self._owner.pop(request_id, None)
            if client is not None:
                self._count[client] -= 1
                if not self._count[client]:
                    del self._count[client]

    def in_flight(self, client: str) -> int:
        with self._lock:
            return self._count.get(client, 0)
