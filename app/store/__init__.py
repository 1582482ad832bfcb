"""The lasting copy of recorded traces: a database (SQLite by default, PostgreSQL by URL)
behind the in-memory TraceStore. db opens it (and moves a bad file aside), schema holds
its tables, migrations their versions (Alembic), repository the queries, writer the one
thread that writes, library what the API and the page ask of it."""
