"""The queries on the traces table: one call, one transaction. Run on the writer thread
(writes) or a request's worker thread (reads), never the engine thread nor the event loop."""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

from sqlalchemy import delete, func, select, update
from sqlalchemy.engine import Engine

from app.store.schema import traces

LISTED = ("id", "model", "created", "prompt", "tokens", "capture_level", "pinned", "nbytes")


@dataclass
class TraceMeta:
    """A trace's row without its data: what the library lists."""
    id: str
    model: str | None
    created: float
    prompt: str = ""
    tokens: int = 0
    capture_level: str | None = None
    pinned: bool = False
    nbytes: int = 0

    def as_dict(self) -> dict:
        return {"id": self.id, "object": "trace", "model": self.model, "created": int(self.created),
                "prompt": self.prompt, "tokens": self.tokens, "capture_level": self.capture_level,
                "pinned": self.pinned, "bytes": self.nbytes}


class TraceRepository:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # --- writes ------------------------------------------------------------------------
    def started(self, meta: TraceMeta) -> None:
        """A request's metadata as it starts (state running; its trace comes when it ends)."""
        with self.engine.begin() as conn:
            if conn.execute(select(traces.c.id).where(traces.c.id == meta.id)).first() is None:
                conn.execute(traces.insert().values(**_row(meta), state="running", data=None))

    def finished(self, meta: TraceMeta, text: str) -> None:
        """The whole trace file, in one transaction (written again when an n > 1 request's
        later choices end)."""
        data = zlib.compress(text.encode(), 1)
        meta.nbytes = len(text)
        with self.engine.begin() as conn:
            old = conn.execute(select(traces.c.pinned).where(traces.c.id == meta.id)).first()
            if old is None:
                conn.execute(traces.insert().values(**_row(meta), state="done", data=data))
            else:
                values = {k: v for k, v in _row(meta).items() if k not in ("pinned", "created")}
                conn.execute(update(traces).where(traces.c.id == meta.id).values(**values, state="done", data=data))

    def forget(self, trace_id: str) -> bool:
        with self.engine.begin() as conn:
            return conn.execute(delete(traces).where(traces.c.id == trace_id)).rowcount > 0

    def pin(self, trace_id: str, on: bool) -> bool:
        with self.engine.begin() as conn:
            return conn.execute(update(traces).where(traces.c.id == trace_id, traces.c.state == "done")
                                .values(pinned=on)).rowcount > 0

    def interrupted(self) -> int:
        """Requests a previous run started and never ended (it crashed): marked, not deleted."""
        with self.engine.begin() as conn:
            return conn.execute(update(traces).where(traces.c.state == "running")
                                .values(state="interrupted")).rowcount

    def prune(self, max_bytes: int) -> int:
        """Drop the oldest unpinned traces while all together pass max_bytes; how many went."""
        with self.engine.begin() as conn:
            total = conn.execute(select(func.coalesce(func.sum(traces.c.nbytes), 0))).scalar_one()
            if total <= max_bytes:
                return 0
            gone = []
            rows = conn.execute(select(traces.c.id, traces.c.nbytes).where(traces.c.pinned.is_(False),
                                                                          traces.c.state == "done")
                                .order_by(traces.c.created))
            for rid, nbytes in rows:
                if total <= max_bytes:
                    break
                gone.append(rid)
                total -= nbytes
            if gone:
                conn.execute(delete(traces).where(traces.c.id.in_(gone)))
            return len(gone)

    # --- reads -------------------------------------------------------------------------
    def load(self, trace_id: str) -> str | None:
        """The trace file's text (None: no finished trace of that id)."""
        with self.engine.connect() as conn:
            row = conn.execute(select(traces.c.data).where(traces.c.id == trace_id, traces.c.state == "done")).first()
        return None if row is None or row[0] is None else zlib.decompress(row[0]).decode()

    def meta(self, trace_id: str) -> TraceMeta | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(*[traces.c[k] for k in LISTED]).where(traces.c.id == trace_id,
                                                                            traces.c.state == "done")).first()
        return None if row is None else TraceMeta(*row)

    def listed(self, limit: int, after: str | None = None, words: list[str] = ()) -> list[TraceMeta]:
        """Finished traces, newest first: up to `limit` after the one named `after` (a cursor, as
        OpenAI's lists take), whose prompt holds every word (any case)."""
        q = select(*[traces.c[k] for k in LISTED]).where(traces.c.state == "done")
        for w in words:
            q = q.where(traces.c.prompt.ilike(f"%{_escaped(w)}%", escape="\\"))
        with self.engine.connect() as conn:
            if after is not None:
                mark = conn.execute(select(traces.c.created).where(traces.c.id == after)).first()
                if mark is None:
                    raise KeyError(after)
                q = q.where((traces.c.created < mark[0]) | ((traces.c.created == mark[0]) & (traces.c.id < after)))
            rows = conn.execute(q.order_by(traces.c.created.desc(), traces.c.id.desc()).limit(limit)).all()
        return [TraceMeta(*r) for r in rows]

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(select(1))


def _row(meta: TraceMeta) -> dict:
    return {"id": meta.id, "model": meta.model, "created": meta.created or time.time(), "prompt": meta.prompt,
            "tokens": meta.tokens, "capture_level": meta.capture_level, "pinned": meta.pinned,
            "nbytes": meta.nbytes}


def _escaped(word: str) -> str:
    return word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
