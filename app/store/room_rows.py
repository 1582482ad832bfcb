"""The queries on the rooms table: a classroom's row written whole (one transaction), and the
rows one server loads back at start-up. Run on the writer thread (writes) or at start-up."""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.engine import Engine

from app.store.schema import rooms, traces


@dataclass
class RoomRow:
    id: str
    key: str
    owner: str
    trace_id: str
    state: str  # JSON (app/classroom/lasting.py)
    trace_text: str | None = None  # the trace file when the traces table does not hold it
    updated: float = 0.0


class RoomRepository:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def holds_trace(self, trace_id: str) -> bool:
        """Whether the traces table has this trace finished (then a room only names it)."""
        with self.engine.connect() as conn:
            return conn.execute(select(traces.c.id).where(traces.c.id == trace_id,
                                                          traces.c.state == "done")).first() is not None

    def save(self, row: RoomRow, with_trace: bool) -> None:
        """The room's state; with_trace: its trace's column too (a copy, or None: read from traces)."""
        values = {"key": row.key, "owner": row.owner, "trace_id": row.trace_id, "state": row.state,
                  "updated": row.updated or time.time()}
        if with_trace:
            values["data"] = None if row.trace_text is None else zlib.compress(row.trace_text.encode(), 1)
        with self.engine.begin() as conn:
            if conn.execute(update(rooms).where(rooms.c.id == row.id).values(**values)).rowcount == 0:
                conn.execute(rooms.insert().values(id=row.id, **{"data": None, **values}))

    def forget(self, room_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(rooms).where(rooms.c.id == room_id))

    def rows(self, owner: str, limit: int) -> list[RoomRow]:
        """This server's rooms, the newest `limit` by their last change (oldest first), each with
        its trace's text (its own copy, else the traces table's; None: neither holds it)."""
        q = (select(rooms.c.id, rooms.c.key, rooms.c.owner, rooms.c.trace_id, rooms.c.state, rooms.c.updated,
                    rooms.c.data, traces.c.data)
             .outerjoin(traces, (traces.c.id == rooms.c.trace_id) & (traces.c.state == "done"))
             .where(rooms.c.owner == owner).order_by(rooms.c.updated.desc()).limit(limit))
        with self.engine.connect() as conn:
            found = conn.execute(q).all()
        out = []
        for rid, key, own, trace_id, state, updated, mine, stored in reversed(found):
            blob = mine if mine is not None else stored
            out.append(RoomRow(rid, key, own, trace_id, state,
                               None if blob is None else zlib.decompress(blob).decode(), updated))
        return out
