"""calibrations: cost-model coefficients fitted to one device's probes, with the probes they came from.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create ``calibrations``: every fit is a new row (history kept), found by its target device."""
    op.create_table(
        "calibrations",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("calibration_id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("target", sa.String(length=200), nullable=False),
        sa.Column("device", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.JSON(), nullable=False),
        sa.Column("values", sa.JSON(), nullable=False),
        sa.Column("probe_ids", sa.JSON(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
    )
    op.create_index("ix_calibrations_calibration_id", "calibrations", ["calibration_id"], unique=True)
    op.create_index("ix_calibrations_target", "calibrations", ["target"])


def downgrade() -> None:
    """Drop ``calibrations`` (plans and probes stay; predictions fall back to the default coefficients)."""
    op.drop_index("ix_calibrations_target", table_name="calibrations")
    op.drop_index("ix_calibrations_calibration_id", table_name="calibrations")
    op.drop_table("calibrations")
