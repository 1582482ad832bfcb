"""`--db` at start-up: the library over the store, with its database opened and migrated, and
one line saying where the traces go."""
from __future__ import annotations

import logging
from typing import Callable

from sqlalchemy.engine import make_url

from app.serving.trace_store import TraceStore
from app.store.db import DatabaseRefused, database_url, open_database, shown
from app.store.library import DB_MAX_BYTES, Library
from app.store.repository import TraceRepository


def open_library(store: TraceStore | None, spec: str | None, say: Callable[[str], None],
                 max_bytes: int = DB_MAX_BYTES) -> Library:
    """DatabaseRefused: the database cannot be used (the caller exits with the message)."""
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its "Context impl ..." lines at every start
    url = database_url(spec)
    if url is None:
        say("traces: memory only (--db none): they are gone when the server stops")
        return Library(store)
    opened = open_database(url, say)
    repo = TraceRepository(opened.engine)
    kind = make_url(url).get_backend_name()
    where = shown(url)
    lost = repo.interrupted()
    say(f"traces: kept in {'SQLite ' if kind == 'sqlite' else 'PostgreSQL '}{where} (schema {opened.revision}"
        + (f"; {lost} request(s) an earlier run never finished are marked interrupted" if lost else "") + ")")
    return Library(store, repo, where, kind, max_bytes)


__all__ = ["DatabaseRefused", "open_library"]
