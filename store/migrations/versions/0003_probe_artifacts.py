"""probe artifacts: named binary records kept with a probe (its allocation stream or CUDA snapshot).

Revision ID: 0003
Revises: 0002
Create Date: 2025-01-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create ``probe_artifacts`` with its unique (probe_id, name) index; plans and probes stay as they are."""
    op.create_table(
        "probe_artifacts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("probe_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("format", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_probe_artifacts_probe_id_name", "probe_artifacts", ["probe_id", "name"], unique=True)


def downgrade() -> None:
    """Drop ``probe_artifacts`` (the stored streams and snapshots are lost; probes and plans stay)."""
    op.drop_index("ix_probe_artifacts_probe_id_name", table_name="probe_artifacts")
    op.drop_table("probe_artifacts")
