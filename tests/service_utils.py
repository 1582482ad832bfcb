"""Drive the app's engine service the way a page does: submit a body and read its
subscription until the request finishes."""
from __future__ import annotations

import time

from app.serving.requests import parse_body


def run_to_end(svc, body: dict, timeout_s: float = 60) -> tuple[str, list[dict]]:
    """Submit `body`; -> (request id, every item its subscription delivered, to the finish
    and a little after)."""
    watch = svc.submit(parse_body(body))
    items, end = [], time.monotonic() + timeout_s
    while not any(i["type"] == "output" and i["finished"] for i in items):
        assert time.monotonic() < end, "the request did not finish"
        items += watch.drain(0.05)
    time.sleep(0.1)  # anything the finishing step still sends (kv.pool comes before its outputs)
    items += watch.drain(0.05)
    svc.unsubscribe(watch)
    return watch.request_id, items
