"""model shapes: the shape cache of traced model configs (what transformers' module tree holds).

Revision ID: 0004
Revises: 0003
Create Date: 2025-02-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create ``model_shapes``, keyed by the hash of a config and the library versions that read it."""
    op.create_table(
        "model_shapes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("model_type", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("shape", sa.JSON(), nullable=False),
    )
    op.create_index("ix_model_shapes_key", "model_shapes", ["key"], unique=True)


def downgrade() -> None:
    """Drop ``model_shapes`` (shapes are traced again on next use; plans and probes stay)."""
    op.drop_index("ix_model_shapes_key", table_name="model_shapes")
    op.drop_table("model_shapes")
