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
