"""Serve the app from a background thread of this process (tests and the measurement
command drive a real browser against it, and read the engine's clock directly)."""
from __future__ import annotations

import threading
import time

import uvicorn

from app.serving.engine_service import EngineService
from app.serving.served_models import ServedModels
from app.server import create_app


class LocalServer:
    def __init__(self, service: EngineService | ServedModels | None, host: str = "127.0.0.1", port: int = 0,
                 app=None) -> None:
        """service: one engine or several (then .service is the first, .models all of them);
        app: serve this one instead (e.g. create_app(None, replay=...), with no engine)."""
        self.models = ServedModels.of(service) if service is not None else None
        self.service = self.models.first if self.models is not None else None
        self.server = uvicorn.Server(uvicorn.Config(app or create_app(self.models), host=host, port=port,
                                                    log_level="warning"))
        self.host = host
        self.thread: threading.Thread | None = None

    def start(self, timeout: float = 60.0) -> "LocalServer":
        if self.models is not None:
            self.models.start()
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.thread.start()
        end = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > end or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.05)
        return self

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=10)
        if self.models is not None:
            self.models.stop()

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

