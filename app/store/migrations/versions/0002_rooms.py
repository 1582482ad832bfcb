"""The rooms table: classrooms that last across restarts.

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rooms",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(300), nullable=False),
        sa.Column("trace_id", sa.String(200), nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=True),
        sa.Column("updated", sa.Float, nullable=False),
    )
    op.create_index("ix_rooms_owner", "rooms", ["owner"])


def downgrade() -> None:
    op.drop_index("ix_rooms_owner", "rooms")
    op.drop_table("rooms")
