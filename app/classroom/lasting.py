"""Classrooms that last: every room's state is written to the trace database (app/store) and
loaded back when the same server starts again, so the presenter's link (with its key) and the
audience's links answer after a restart and land on the stage the class was on.

What is kept: the room's trace (the library's row when it holds it, else a copy), its stages
added after the journey, the current stage, the presenter's position / layer / head, every
question (its candidates, order, open or revealed, and its votes). A change only marks the room
(the event loop never waits on a disk): one job per room on the library's writer thread reads the
room's newest state when it runs, so a burst of moves is one write. A room is the server's that
made it (its owner: host and port); two servers on one PostgreSQL each load their own."""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict
from typing import Callable

from app.classroom.lab_stage import LabStage
from app.classroom.question import Candidate, Question
from app.classroom.rooms import Classrooms, Room
from app.serving.recording import Recording, TraceFileError
from app.store.library import Library
from app.store.room_rows import RoomRepository, RoomRow
from visualizers.journey import Stage

log = logging.getLogger("tokentrace.db")
SCHEMA = 1


def snapshot(room: Room) -> str:
    """Where the room stands, as JSON (under its lock: votes may be arriving)."""
    with room.lock:
        q = room.question
        out = {"schema": SCHEMA, "stage": room.stage, "version": room.version, "trace_version": room.trace_version,
               "ask_at": room.ask_at, "revealed": room.revealed, "pick": dict(room.pick),
               "questions": [asdict(x) for x in room.questions],
               "open": q is not None and bool(room.questions) and room.questions[-1] is q,
               # extra: a Stage's fields, or a LabStage's {"result"}
               "extra": [asdict(s) for s in room.extra], "with_journey": room.with_journey, "code": room.code_open}
    return json.dumps(out, separators=(",", ":"))


def _question(d: dict) -> Question:
    return Question(**{**d, "candidates": [Candidate(**c) for c in d["candidates"]]})


def restored(row: RoomRow, rec: Recording) -> Room:
    """The room as it stood. Its versions move on (a browser's cached stage of the old numbering
    is never taken for a new one)."""
    s = json.loads(row.state)
    questions = [_question(d) for d in s["questions"]]
    return Room(row.id, row.key, rec, None, stage=int(s["stage"]), version=int(s["version"]) + 1,
                trace_version=int(s["trace_version"]) + 1, question=questions[-1] if s["open"] else None,
                ask_at=s["ask_at"], revealed=bool(s["revealed"]), pick=dict(s["pick"]), questions=questions,
                extra=[LabStage(d["result"]) if "result" in d else Stage(**{**d, "panels": tuple(d["panels"])})
                       for d in s["extra"]],
                with_journey=bool(s["with_journey"]), code_open=bool(s.get("code")))  # (code: since 2026-12-06)


def _recording(text: str) -> Recording:
    """The room's trace; an experiment's room holds an empty one (its stage is the result), which
    no trace file may be."""
    data = json.loads(text)
    if isinstance(data, dict) and data.get("events") == [] and data.get("outputs") == []:
        return Recording(data["id"], data["model"], data.get("body"), [], [])
    return Recording.loads(text)


class RoomKeeper:
    """Classrooms' listener: writes each changed room through the library's writer."""

    def __init__(self, library: Library, owner: str) -> None:
        self.library, self.owner = library, owner
        self.repo = RoomRepository(library.repo.engine)
        self._lock = threading.Lock()
        self._pending: set[str] = set()  # rooms with a write queued (a change meanwhile rides on it)
        self._open: dict[str, Room] = {}
        self._settled: set[str] = set()  # rooms whose trace column is written (their trace has ended)

    # --- from any thread, the event loop included: only queue ---------------------------------
    def changed(self, room: Room) -> None:
        with self._lock:
            self._open[room.room_id] = room
            if room.room_id in self._pending:
                return
            self._pending.add(room.room_id)
        self.library.writer.put(lambda _repo: self._write(room))

    def closed(self, room_id: str) -> None:
        with self._lock:
            self._open.pop(room_id, None)
            self._settled.discard(room_id)
        self.library.writer.put(lambda _repo: self.repo.forget(room_id))

    def adopt(self, room: Room) -> None:
        """A room loaded back: already written whole."""
        room.on_change = self.changed
        with self._lock:
            self._open[room.room_id] = room
            self._settled.add(room.room_id)

    # --- the writer thread ----------------------------------------------------------------------
    def _write(self, room: Room) -> None:
        with self._lock:
            self._pending.discard(room.room_id)
            if self._open.get(room.room_id) is not room:  # closed meanwhile
                return
            settle = room.room_id not in self._settled and not room.live
        state = snapshot(room)
        text = None
        if settle and not self.repo.holds_trace(room.rec.request_id):
            text = room.rec.dumps()  # a trace the library does not hold: the room keeps its own copy
        self.repo.save(RoomRow(room.room_id, room.key, self.owner, room.rec.request_id, state, text, time.time()),
                       with_trace=settle)
        if settle:
            with self._lock:
                self._settled.add(room.room_id)

    def load_into(self, classrooms: Classrooms, say: Callable[[str], None]) -> int:
        """This server's rooms as they stood (at start-up, before serving); how many came back."""
        back, lost = [], 0
        for row in self.repo.rows(self.owner, classrooms.max_rooms):
            try:
                if row.trace_text is None:
                    raise TraceFileError("its trace is not in the database (deleted, or its request never ended)")
                room = restored(row, _recording(row.trace_text))
            except (TraceFileError, KeyError, TypeError, ValueError) as e:
                lost += 1
                log.warning("classroom %s does not come back: %s", row.id, e)
                self.library.writer.put(lambda _repo, rid=row.id: self.repo.forget(rid))
                continue
            self.adopt(room)
            classrooms.add(room)
            back.append(room)
        # every stage rendered off the loop, one room after another (the newest first)
        threading.Thread(target=lambda: [r.prerender() for r in reversed(back)], name="classroom-restore",
                         daemon=True).start()
        if back or lost:
            say(f"classrooms: {len(back)} room(s) back from {self.library.where}"
                + (f" ({lost} could not be: see the log)" if lost else ""))
        return len(back)


def lasting_classrooms(library: Library, owner: str, say: Callable[[str], None]) -> Classrooms:
    """The server's Classrooms: kept in the library's database (memory only without one)."""
    classrooms = Classrooms()
    if library.repo is None:
        return classrooms
    keeper = RoomKeeper(library, owner)
    try:
        keeper.load_into(classrooms, say)
    except Exception as e:  # noqa: BLE001 - a room table that cannot be read must not stop the server
        log.warning("classrooms: none loaded back from %s: %s", library.where, e)
    classrooms.keeper = keeper
    return classrooms
