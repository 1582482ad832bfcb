"""The timeline's axis ends with the request's last token, not with its `finish` event, which
follows the logit lenses computed after the last token (engine/trace/lens_queue.py): seconds
of lens work must not squeeze the engine's steps into the chart's left edge."""
from __future__ import annotations

import re

from visualizers.timeline import timeline_html


def events(finish_after_s: float) -> list[dict]:
    rid = "r"
    out = [{"type": "request.arrive", "request_id": rid, "step": 0, "ts": 10.0},
           {"type": "tokenize", "request_id": rid, "step": 0, "ts": 10.0, "seconds": 0.001, "count": 3}]
    for k in range(1, 4):
        ts = 10.0 + 0.1 * k
        out.append({"type": "schedule.step", "request_id": None, "step": k, "ts": ts, "forward_seconds": 0.05,
                    "num_tokens": 3 if k == 1 else 1,
                    "batch": [{"request_id": rid, "kind": "prefill" if k == 1 else "decode",
                               "num_tokens": 3 if k == 1 else 1}]})
        out.append({"type": "token", "request_id": rid, "step": k, "ts": ts, "index": k - 1, "t": ts - 10.0,
                    "token_id": 5, "text": "a", "latency": 0.1})
    out.append({"type": "finish", "request_id": rid, "step": 3, "ts": 10.3 + finish_after_s, "reason": "length",
                "ttft": 0.1, "ttft_split": {"tokenize": 0.001}})
    return out


def axis_end(html: str) -> str:
    return re.findall(r"<span style='right:[^']*'>([^<]*)</span>", html)[-1]


def test_the_axis_ends_with_the_last_token_not_the_trace():
    at_once, later = timeline_html(events(0.0), "r"), timeline_html(events(5.0), "r")
    assert axis_end(at_once) == axis_end(later) == "301.0 ms"  # from tokenizing to the last token
    # a request that ended with no token (stopped in the queue) still ends at its finish
    no_token = [e for e in events(1.0) if e["type"] not in ("token", "schedule.step")]
    assert axis_end(timeline_html(no_token, "r")) == "1,301.0 ms"
