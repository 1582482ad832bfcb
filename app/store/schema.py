"""The tables (SQLAlchemy Core). Alembic's migrations (migrations/versions) create and change
them; the revision a database holds is kept in its alembic_version table."""
from __future__ import annotations

from sqlalchemy import Boolean, Column, Float, Index, Integer, LargeBinary, MetaData, String, Table, Text

metadata = MetaData()

# one row a request: its metadata when it starts (state "running"), the trace file when it ends ("done");
# a request the server never saw end (a crash) is "interrupted" at the next start-up
traces = Table(
    "traces", metadata,
    Column("id", String(200), primary_key=True),
    Column("model", String(200), nullable=True),
    Column("created", Float, nullable=False),  # seconds since the epoch
    Column("prompt", Text, nullable=False, default=""),  # the prompt's first words (what search reads)
    Column("tokens", Integer, nullable=False, default=0),  # prompt + completion
    Column("capture_level", String(16), nullable=True),
    Column("pinned", Boolean, nullable=False, default=False),
    Column("state", String(16), nullable=False),  # running, done, interrupted
    Column("nbytes", Integer, nullable=False, default=0),  # the trace file's size as JSON
    Column("data", LargeBinary, nullable=True),  # the trace file (Recording.dumps), zlib-compressed
    Index("ix_traces_created", "created"),
)

# one row a classroom (app/classroom/lasting.py): where it stands, as JSON, and the trace it shows: the
# traces table's row of trace_id, or its own copy (data) for a trace the library does not hold (an uploaded
# file, an experiment's result); owner: the server (host:port) that serves it and loads it back at start-up
rooms = Table(
    "rooms", metadata,
    Column("id", String(64), primary_key=True),
    Column("key", String(64), nullable=False),  # the presenter's secret (as its link carries it)
    Column("owner", String(300), nullable=False),
    Column("trace_id", String(200), nullable=False),
    Column("state", Text, nullable=False),
    Column("data", LargeBinary, nullable=True),  # the trace file, zlib-compressed (None: read from traces)
    Column("updated", Float, nullable=False),
    Index("ix_rooms_owner", "owner"),
)
