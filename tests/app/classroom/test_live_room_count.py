"""A room made from a request whose trace has not ended is re-read as it grows; its screens
reload their stage list when its stage count changes, and a presenter's keys pressed meanwhile
were lost. A draft's stage is listed while the request runs and, where no round came, skipped at
the trace's end: the room keeps listing it, so the count its screens hold never moves. A real
request (tiny MoE, n-gram lookup that finds nothing), its trace re-read event by event."""
from __future__ import annotations

from dataclasses import replace

from app.classroom import rooms
from app.classroom.rooms import Room
from app.serving.recording import record_request
from app.serving.requests import build_body
from tests.service_utils import app_service, run_to_end, started


def test_a_live_rooms_stage_count_stays_when_its_trace_ends(checkpoint, monkeypatch):
    svc = app_service(checkpoint, "--draft", "ngram")
    with started(svc):
        body = build_body("m", "", "Tell me about foxes.", 0.8, 0, 1.0, 6, 1, True, 3, "full") | {"seed": 1}
        rid, _ = run_to_end(svc, body)
        whole = record_request(svc.store, rid, svc.model_info(), svc.piece, svc.is_special)
    assert not any(e["type"] == "spec" for e in whole.events)  # no lookup matched: no round
    end = next(i for i, e in enumerate(whole.events) if e["type"] == "finish")
    ended = Room("done", "k", whole)  # the ended trace: its draft's stage is one line, not a stage
    running = [replace(whole, events=whole.events[:n], outputs=[o for o in whole.outputs if not o["finished"]])
               for n in range(end // 2, end + 1, max(1, end // 8))]  # (the store holds its end until `finish`)
    grown = iter(running[1:] + [whole])
    room = Room("live", "k", running[0], refresh=lambda: next(grown, whole))
    monkeypatch.setattr(rooms, "REFRESH_EVERY", -1.0)  # every update re-reads
    count = len(room.stage_list())
    assert "spec" in [s.key for s in room.stage_list()] and "spec" not in [s.key for s in ended.stage_list()]
    while room.live:
        room.update()
        assert len(room.stage_list()) == room.state()["count"] == count
    assert room.finished and len(room.stage_list()) == count == len(ended.stage_list()) + 1
    assert "Speculative decoding" in next(s for s in room.stage_list() if s.key == "spec").text
