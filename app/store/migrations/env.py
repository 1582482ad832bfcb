"""Alembic's environment: run on the connection app.store.db hands over (never a URL from a
file), so migrations run the same from the server's start-up and from the tests."""
from alembic import context

from app.store.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
