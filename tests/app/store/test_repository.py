"""The database layer against real SQLite and PostgreSQL: migrations and the schema version,
the list (newest first, pages, search), pins against the bound, delete, a crash's leftovers."""
from __future__ import annotations

import sqlite3
import time

import pytest
from sqlalchemy import text

from app.__main__ import library_of, parse_args
from app.store.db import DatabaseRefused, database_url, open_database
from app.store.repository import TraceMeta, TraceRepository


def _repo(url: str) -> TraceRepository:
    return TraceRepository(open_database(database_url(url), lambda line: None).engine)


def _done(repo: TraceRepository, rid: str, prompt: str, created: float, size: int = 10) -> None:
    repo.started(TraceMeta(rid, "m", created, prompt))
    repo.finished(TraceMeta(rid, "m", created, prompt, tokens=7, capture_level="full"), "x" * size)


def test_schema_version_is_stored_and_checked(db_url):
    opened = open_database(database_url(db_url), lambda line: None)
    with opened.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == opened.revision == "0002"
    again = open_database(database_url(db_url), lambda line: None)  # reopening migrates nothing, keeps rows
    assert again.revision == "0002" and again.moved_aside is None


def test_list_pages_search_pin_delete(db_url):
    repo = _repo(db_url)
    t0 = time.time()
    for i in range(5):
        _done(repo, f"r{i}", f"Tell me about cats number {i}" if i % 2 else f"dogs {i} 100%_", t0 + i)
    repo.started(TraceMeta("running", "m", t0 + 9, "cats unfinished"))  # metadata only: not listed
    first = repo.listed(2)
    assert [m.id for m in first] == ["r4", "r3"]
    assert [m.id for m in repo.listed(2, after="r3")] == ["r2", "r1"]
    assert [m.id for m in repo.listed(2, after="r0")] == []  # past the end: empty, not an error
    with pytest.raises(KeyError):
        repo.listed(2, after="nope")
    assert [m.id for m in repo.listed(10, words=["CATS"])] == ["r3", "r1"]
    assert [m.id for m in repo.listed(10, words=["100%_"])] == ["r4", "r2", "r0"]  # LIKE's wildcards escaped
    assert [m.id for m in repo.listed(10, words=["%"])] == ["r4", "r2", "r0"]
    assert repo.load("r3") == "x" * 10 and repo.load("running") is None and repo.load("nope") is None
    assert first[0].tokens == 7 and first[0].capture_level == "full" and first[0].nbytes == 10
    assert repo.pin("r0", True) and not repo.pin("nope", True)
    assert repo.prune(30) == 2  # the oldest unpinned go first (r1, r2); the pinned r0 stays
    assert [m.id for m in repo.listed(10)] == ["r4", "r3", "r0"] and repo.meta("r0").pinned
    assert repo.forget("r0") and not repo.forget("r0") and repo.load("r0") is None
    assert repo.interrupted() == 1 and repo.meta("running") is None


def test_a_file_that_is_not_a_database_is_moved_aside(tmp_path):
    path = tmp_path / "traces.db"
    path.write_bytes(b"my notes, not a database\n" * 40)
    said = []
    opened = open_database(database_url(str(path)), said.append)
    assert opened.moved_aside is not None and opened.moved_aside.read_bytes().startswith(b"my notes")
    assert len(said) == 1 and "moved aside" in said[0] and opened.moved_aside.name in said[0]
    _done(TraceRepository(opened.engine), "a", "hello", time.time())
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_newer_schema_is_moved_aside_on_sqlite_and_refused_on_postgresql(db_url):
    repo = _repo(db_url)
    _done(repo, "kept", "hello", time.time())
    with repo.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    repo.engine.dispose()
    said = []
    if db_url.startswith("postgresql"):
        with pytest.raises(DatabaseRefused, match="9999"):
            open_database(database_url(db_url), said.append)
        return
    opened = open_database(database_url(db_url), said.append)
    assert opened.moved_aside is not None and "newer schema" in said[0]
    old = sqlite3.connect(opened.moved_aside)  # the user's data is still there, beside the fresh file
    assert old.execute("SELECT id FROM traces").fetchall() == [("kept",)]
    assert TraceRepository(opened.engine).listed(10) == []


def test_sqlite_runs_in_wal_with_a_busy_timeout(tmp_path):
    repo = _repo(str(tmp_path / "t.db"))
    with repo.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar_one() == "wal"
        assert conn.execute(text("PRAGMA busy_timeout")).scalar_one() == 5000


def test_db_flag_forms(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TOKENTRACE_DB", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert database_url(None) == f"sqlite:///{tmp_path}/.cache/tokentrace/traces.db"
    assert database_url("none") is None and database_url("NONE") is None
    assert database_url(str(tmp_path / "x.db")) == f"sqlite:///{tmp_path}/x.db"
    assert database_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    monkeypatch.setenv("TOKENTRACE_DB", "none")
    assert database_url(None) is None and database_url(str(tmp_path / "x.db")).startswith("sqlite")
    with pytest.raises(SystemExit, match="cannot start: cannot open the database"):
        library_of(None, parse_args(["--db", "postgresql://tt@/none?host=/nonexistent&port=1"]))
