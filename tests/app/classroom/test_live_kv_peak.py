"""Issue 25, item 8 (the last session's closing note): the classroom's KV stage is drawn at the
request's busiest KV step, and with more than one decode engine (--disaggregate --decode-ranks
2) that step was looked for in decode engine 0's pool only: a request that decoded on engine 1
never held a block there, so its "busiest" step was its last, after every block was freed, and
the class saw an empty grid and "held K/V for 0 tokens"."""
from __future__ import annotations

import re
import time

import pytest

from app.classroom.rooms import Room
from app.serving.recording import ReplayCursor, record_request
from app.serving.requests import build_body, parse_body
from tests.service_utils import app_service, started

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")]


def both_to_the_end(svc, bodies: list[dict]) -> list[str]:
    """Submit every body at once (so that the router spreads them), read each to its end."""
    watches = [svc.submit(parse_body(b)) for b in bodies]
    done, end = set(), time.monotonic() + 120
    while len(done) < len(watches):
        assert time.monotonic() < end, "the requests did not finish"
        for w in watches:
            if any(i["type"] == "output" and i["finished"] for i in w.drain(0.02)):
                done.add(w.request_id)
    time.sleep(0.2)  # the finishing step's last pool events
    for w in watches:
        svc.unsubscribe(w)
    return [w.request_id for w in watches]


def test_the_busiest_kv_step_counts_every_decode_engines_pool(checkpoint):
    svc = app_service(checkpoint, "--disaggregate", "--decode-ranks", "2", "--block-size", "4", model=None)
    with started(svc):
        bodies = [build_body("m", "Be brief.", f"Tell me about foxes, part {i}. " * (3 + i), 0.0, 0, 1.0, 10, None, False,
                             1, "basic") | {"ignore_eos": True} for i in range(2)]
        rids = both_to_the_end(svc, bodies)
        recs = [record_request(svc.store, rid, svc.model_info(), svc.piece, svc.is_special) for rid in rids]
    dst = {r.request_id: next(e["dst"] for e in r.events if e["type"] == "kv.transfer") for r in recs}
    assert sorted(dst.values()) == ["decode 0", "decode 1"], dst
    for rec in recs:
        cursor = ReplayCursor(rec)
        peak = cursor.peak_kv_frame()
        assert peak < cursor.last_frame, (dst[rec.request_id], peak)  # its very last frame has freed its blocks
        room = Room("room", "key", rec, revealed=True)  # the whole answer (no question hides its tokens)
        kv = next(i for i, s in enumerate(room.stage_list()) if s.key == "kv")
        html = room.render(kv)
        mine = int(re.search(r'data-mine="(\d+)"', html)[1]) + int(re.search(r'data-shared="(\d+)"', html)[1])
        assert mine > 0, (dst[rec.request_id], html[:600])  # its blocks, on its own decode engine's grid
        held = re.search(r"this request held K/V for <b>([\d,]+)</b> token", room.stage_list()[kv].text)
        assert held and int(held[1].replace(",", "")) > 0, (dst[rec.request_id], room.stage_list()[kv].text)
