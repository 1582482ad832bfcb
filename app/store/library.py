"""The library of recorded traces: what GET/DELETE /v1/traces and the page's Library tab ask
for, over the in-memory store (the hot cache: running and recent requests) and the database
(the lasting copy: every finished trace, across restarts and servers).

It is the store's listener: a trace that starts queues its metadata, one that ends queues its
whole file (built from memory on the writer thread, so the engine thread only puts a request
id in a queue). Reads try memory first, then the database; with the database gone (or
--db none) the list is the memory's, and `health()` says which."""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Callable

from sqlalchemy.exc import SQLAlchemyError

from app.serving.recording import Recording
from app.serving.trace_store import TraceStore
from app.store.defaults import DB_MAX_BYTES
from app.store.repository import TraceMeta, TraceRepository
from app.store.summary import finished_meta, started_meta
from app.store.writer import TraceWriter

log = logging.getLogger("tokentrace.db")
MAX_LIST = 100


class Library:
    def __init__(self, store: TraceStore | None, repo: TraceRepository | None = None, where: str = "memory only",
                 kind: str = "none", max_bytes: int = DB_MAX_BYTES) -> None:
        self.store, self.repo, self.where, self.kind, self.max_bytes = store, repo, where, kind, max_bytes
        self.writer = TraceWriter(repo, where) if repo is not None else None
        self.recorder: Callable[[str], Recording | None] = lambda rid: None  # memory's trace as a file
        self._created: OrderedDict[str, float] = OrderedDict()  # when each request started (wall clock)
        self._lock = threading.Lock()
        self.private = False  # a public server without --api-key: the list is not shown (set by the server)
        if store is not None:
            store.listener = self

    # --- the store's listener (engine thread, request threads: only queue) ---------------------------
    def started(self, request_id: str, model: str | None, body: dict | None) -> None:
        with self._lock:
            self._created[request_id] = time.time()
            while len(self._created) > 4096:
                self._created.popitem(last=False)
        if self.writer is not None:
            meta = started_meta(request_id, model, body, self._created[request_id])
            self.writer.put(lambda repo: repo.started(meta))

    def finished(self, request_id: str) -> None:
        if self.writer is not None:
            root = self._root(request_id)
            self.writer.put(lambda repo: self._write(repo, root))

    def discarded(self, request_id: str) -> None:
        if self.writer is not None:
            self.writer.put(lambda repo: repo.forget(request_id))

    def _root(self, request_id: str) -> str:
        """An n > 1 request's choice "<id>.i" is written as part of <id>'s file."""
        head, _, tail = request_id.rpartition(".")
        if head and tail.isdigit() and self.store is not None and head in self.store:
            return head
        return request_id

    def _write(self, repo: TraceRepository, request_id: str) -> None:
        rec = self.recorder(request_id)
        if rec is None:  # dropped from memory meanwhile, deleted, or traced at level off with no events
            return
        pinned = self.store is not None and self.store.pinned(request_id)
        repo.finished(finished_meta(rec, self.created(request_id), pinned), rec.dumps())
        if self.max_bytes:
            repo.prune(self.max_bytes)

    def created(self, request_id: str) -> float:
        with self._lock:
            return self._created.get(request_id) or time.time()

    # --- reads -----------------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        return self.repo is not None and self.writer.error is None

    def recording(self, request_id: str) -> Recording | None:
        rec = self.recorder(request_id) if self.store is not None and request_id in self.store else None
        if rec is not None:
            return rec
        text = self.stored_text(request_id)
        return None if text is None else Recording.loads(text)

    def stored_text(self, request_id: str) -> str | None:
        """The database's file of a trace (None: not there, or the database is down)."""
        if not self.up:
            return None
        try:
            return self.repo.load(request_id)
        except SQLAlchemyError as e:
            self.writer._down(e)
            return None

    def listed(self, limit: int = 20, after: str | None = None, query: str = "") -> tuple[list[dict], bool]:
        """Up to `limit` traces newest first after the one named `after`, whose prompt holds every
        word of `query`; and whether more follow. KeyError: `after` names no listed trace."""
        limit = max(1, min(int(limit), MAX_LIST))
        words = query.split()
        if self.up:
            try:
                rows = self.repo.listed(limit + 1, after, words)
                return [self._shown(m) for m in rows[:limit]], len(rows) > limit
            except SQLAlchemyError as e:
                self.writer._down(e)
        rows = self._memory_list(words)
        if after is not None:
            ids = [m.id for m in rows]
            if after not in ids:
                raise KeyError(after)
            rows = rows[ids.index(after) + 1:]
        return [self._shown(m) for m in rows[:limit]], len(rows) > limit

    def _shown(self, meta: TraceMeta) -> dict:
        out = meta.as_dict()
        if self.store is not None and self.store.pinned(meta.id):
            out["pinned"] = True
        return out

    def _memory_list(self, words: list[str]) -> list[TraceMeta]:
        """The finished traces memory keeps, newest first."""
        out = []
        for rid in reversed(self.store.request_ids() if self.store is not None else []):
            brief = self.store.brief(rid)
            if brief is None or not brief["finished"] or self._root(rid) != rid:
                continue
            meta = started_meta(rid, brief["model"], brief["body"], self.created(rid))
            meta.tokens, meta.capture_level = brief["tokens"], brief["level"] or meta.capture_level
            meta.pinned, meta.nbytes = brief["pinned"], brief["nbytes"]
            if all(w.lower() in meta.prompt.lower() for w in words):
                out.append(meta)
        return out

    # --- changes (a request's worker thread: queued after the writes before them) ------------------
    def exists(self, request_id: str) -> bool:
        if self.store is not None and request_id in self.store:
            return True
        try:
            return self.up and self.repo.meta(request_id) is not None
        except SQLAlchemyError as e:
            self.writer._down(e)
            return False

    def delete(self, request_id: str) -> bool:
        found = self.exists(request_id)
        if self.store is not None:
            self.store.remove(request_id)
        if found and self.writer is not None:
            self.writer.put(lambda repo: repo.forget(request_id))
            self.writer.flush(2.0)
        return found

    def pin(self, request_id: str, on: bool = True) -> bool:
        found = self.exists(request_id)
        if self.store is not None:
            self.store.pin(request_id, on)
        if found and self.writer is not None:
            self.writer.put(lambda repo: repo.pin(request_id, on))
            self.writer.flush(2.0)
        return found

    def add_file(self, rec: Recording) -> bool:
        """A trace file into the database (POST /v1/traces); False: no database to hold it."""
        if not self.up:
            return False
        meta = finished_meta(rec, time.time(), False)
        self.writer.put(lambda repo: repo.finished(meta, rec.dumps()))
        return self.writer.flush(10.0)

    def is_pinned(self, request_id: str) -> bool:
        if self.store is not None and self.store.pinned(request_id):
            return True
        try:
            meta = self.repo.meta(request_id) if self.up else None
        except SQLAlchemyError:
            meta = None
        return bool(meta and meta.pinned)

    def health(self) -> dict:
        """What /healthz says of the database."""
        if self.repo is None:
            return {"kind": "none", "ok": True, "where": "memory only"}
        w = self.writer
        return {"kind": self.kind, "ok": w.error is None, "where": self.where, "pending": w.pending,
                "error": w.error, "down_since": w.down_since, "lost": w.lost}

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
