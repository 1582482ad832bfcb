"""--share: a public https://*.gradio.live link to this server through Gradio's share
tunnel, the one `Blocks.launch(share=True)` uses (our page is mounted on FastAPI, so
launch() never runs and the tunnel is opened here).

It runs in a background thread: the local server starts at once, and without internet
one line says so and the local server keeps serving.
"""
from __future__ import annotations

import secrets
import threading
from typing import Callable

LOOPBACK = "127.0.0.1"


def open_share_link(port: int, say: Callable[[str], None] = print, timeout: float = 60.0) -> threading.Thread:
    """Ask Gradio's share server for a tunnel to 127.0.0.1:port; `say` reports the outcome
    in one line (the public URL, or why there is none)."""
    def run() -> None:
        try:
            from gradio import networking
            url = networking.setup_tunnel(local_host=LOOPBACK, local_port=port,
                                          share_token=secrets.token_urlsafe(32), share_server_address=None,
                                          share_server_tls_certificate=None)
            say(f"--share: public link {url.replace('http://', 'https://', 1)} (it forwards to this machine; "
                "it lasts while this process runs)")
        except Exception as e:  # no internet, a firewall, the frpc binary cannot be fetched...
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            say(f"--share: could not create a public link ({reason[:160]}); this needs internet access to "
                f"api.gradio.app. Still serving locally on http://{LOOPBACK}:{port}")

    thread = threading.Thread(target=run, name="share-link", daemon=True)
    thread.start()

    def watchdog() -> None:  # a blocked network can hang instead of failing: say so once
        thread.join(timeout)
        if thread.is_alive():
            say(f"--share: no public link after {timeout:.0f} s (is the network blocked?); still serving locally")
    threading.Thread(target=watchdog, name="share-watchdog", daemon=True).start()
    return thread
