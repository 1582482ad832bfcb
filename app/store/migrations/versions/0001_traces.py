"""The traces table.

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "traces",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("model", sa.String(200), nullable=True),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("prompt", sa.Text, nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("capture_level", sa.String(16), nullable=True),
        sa.Column("pinned", sa.Boolean, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("nbytes", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=True),
    )
    op.create_index("ix_traces_created", "traces", ["created"])


def downgrade() -> None:
    op.drop_index("ix_traces_created", "traces")
    op.drop_table("traces")
