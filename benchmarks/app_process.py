"""`python -m app` started in its own process on a free loopback port, ready once /healthz
answers (the load tests measure a server that shares no CPU with the clients driving it)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: list[str], timeout: float = 300, poll: float = 0.5) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = tempfile.TemporaryFile()  # a pipe nobody reads would fill and stall the server
    proc = subprocess.Popen([sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", str(port), *args],
                            stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    url, end = f"http://127.0.0.1:{port}", time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError("the server exited: " + log.read().decode(errors="replace")[-2000:])
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if b" 200 " in s.recv(100):
                    return proc, url
        except OSError:
            pass
        time.sleep(poll)
    proc.kill()
    raise RuntimeError("the server did not start")
