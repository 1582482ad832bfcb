"""Which database, opened and at this code's schema: `--db` as given (a path, a URL, "none")
becomes an SQLAlchemy engine whose schema Alembic has brought to the newest revision.

SQLite runs in WAL mode with a busy timeout (readers never wait for the writer; two servers on
one file wait their turn instead of failing) and synchronous=NORMAL: a committed trace survives
the process being killed (WAL's commit is in the file before the call returns); only a power
cut may lose the last commits. A file that is not a database, or holds a schema newer than
this code knows, is moved aside (renamed beside itself, never deleted) and a fresh one opened.
A PostgreSQL database of a newer schema is refused: one cannot move it aside."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError

MIGRATIONS = Path(__file__).with_name("migrations")
SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 5000


class DatabaseRefused(RuntimeError):
    """The database cannot be used (the message says why, in one line)."""


class SchemaTooNew(RuntimeError):
    pass


def default_path() -> Path:
    """~/.cache/tokentrace/traces.db (beside the models' folder)."""
    return Path.home() / ".cache" / "tokentrace" / "traces.db"


def database_url(spec: str | None) -> str | None:
    """--db as given -> an SQLAlchemy URL (None: memory only). None or "" -> the default
    file ($TOKENTRACE_DB first: "none" there turns it off, as the tests do)."""
    spec = spec if spec else os.environ.get("TOKENTRACE_DB") or str(default_path())
    if spec.lower() == "none":
        return None
    if "://" in spec:
        if spec.startswith("postgresql://") or spec.startswith("postgres://"):
            spec = "postgresql+psycopg://" + spec.split("://", 1)[1]  # psycopg 3, not the default psycopg2
        try:
            make_url(spec)
        except ArgumentError as e:
            raise DatabaseRefused(f"--db {spec!r} is not a database URL: {e}") from None
        return spec
    return f"sqlite:///{Path(spec).expanduser().resolve()}"


def shown(url: str) -> str:
    """The URL as printed: the file's path, or the URL without its password."""
    u = make_url(url)
    return u.database if u.get_backend_name() == "sqlite" else u.render_as_string(hide_password=True)


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cur = dbapi_connection.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # pre_ping: a connection the server dropped (PostgreSQL restarted) is replaced, not failed on;
    # connect_timeout: a database gone away is found out in seconds
    return create_engine(url, pool_pre_ping=True, pool_size=4, connect_args={"connect_timeout": 3})


def _alembic(connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def migrate(engine: Engine) -> str:
    """Bring the schema to the newest revision; its revision. SchemaTooNew: the database holds
    one this code does not know (a newer TokenTrace wrote it)."""
    with engine.begin() as conn:
        cfg = _alembic(conn)
        scripts = ScriptDirectory.from_config(cfg)
        current = MigrationContext.configure(conn).get_current_revision()
        if current is not None:
            try:
                scripts.get_revision(current)
            except CommandError:
                raise SchemaTooNew(f"its schema revision {current!r} is newer than this TokenTrace's "
                                   f"({scripts.get_current_head()!r})") from None
        command.upgrade(cfg, "head")
        return scripts.get_current_head()


def _not_sqlite(path: Path) -> bool:
    with path.open("rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    return len(head) > 0 and head != SQLITE_MAGIC


def move_aside(path: Path, why: str, say: Callable[[str], None]) -> Path:
    """Rename the file (and its WAL files) beside itself: "traces.db.bad-20261204-2150"."""
    aside = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while aside.exists():
        aside, n = aside.with_name(f"{path.name}.bad-{time.strftime('%Y%m%d-%H%M%S')}-{n}"), n + 1
    path.rename(aside)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(aside.with_name(aside.name + suffix))
    say(f"database {path} {why}: moved aside to {aside.name}; a fresh one is opened (nothing was deleted)")
    return aside


@dataclass
class Opened:
    engine: Engine
    url: str
    revision: str
    moved_aside: Path | None = None


def open_database(url: str, say: Callable[[str], None]) -> Opened:
    """The engine at the newest schema. DatabaseRefused: it cannot be used (a PostgreSQL one of
    a newer schema, or unreachable at start-up)."""
    sqlite = make_url(url).get_backend_name() == "sqlite"
    path = Path(make_url(url).database) if sqlite else None
    moved = None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_file() and _not_sqlite(path):
            moved = move_aside(path, "is not an SQLite database", say)
    for attempt in (1, 2):
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return Opened(engine, url, migrate(engine), moved)
        except SchemaTooNew as e:
            engine.dispose()
            if path is None or attempt == 2:
                raise DatabaseRefused(f"the database {shown(url)} cannot be used: {e}") from None
            moved = move_aside(path, f"holds a newer schema ({e})", say)
        except DatabaseError as e:
            engine.dispose()
            if path is None or attempt == 2 or not path.is_file():
                raise DatabaseRefused(f"cannot open the database {shown(url)}: "
                                      f"{' '.join(str(e.orig or e).split())[:300]}") from None
            moved = move_aside(path, "cannot be read as a database", say)
    raise AssertionError("unreachable")
