"""probes: one row per measured probe (keyed by its canonical hash), and one per probe run.

Revision ID: 0002
Revises: 0001
Create Date: 2024-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create ``probe_runs`` and ``probes`` with their indexes; ``plans`` is left as it is."""
    op.create_table(
        "probe_runs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("request_keys", sa.JSON(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
    )
    op.create_index("ix_probe_runs_run_id", "probe_runs", ["run_id"], unique=True)
    op.create_index("ix_probe_runs_created_at", "probe_runs", ["created_at"])
    op.create_index("ix_probe_runs_status", "probe_runs", ["status"])

    op.create_table(
        "probes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("probe_id", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("device", sa.String(length=32), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("failed_phase", sa.Text(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("fingerprint", sa.JSON(), nullable=True),
        sa.Column("peak_allocated_bytes", sa.BigInteger(), nullable=False),
        sa.Column("peak_reserved_bytes", sa.BigInteger(), nullable=False),
        sa.Column("step_time_s", sa.Float(), nullable=False),
        sa.Column("wall_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_probes_probe_id", "probes", ["probe_id"], unique=True)
    op.create_index("ix_probes_key", "probes", ["key"])
    op.create_index("ix_probes_run_id", "probes", ["run_id"])
    op.create_index("ix_probes_created_at", "probes", ["created_at"])
    op.create_index("ix_probes_kind", "probes", ["kind"])


def downgrade() -> None:
    """Drop ``probes`` and ``probe_runs`` (the stored measurements are lost; plans stay)."""
    for name in ("kind", "created_at", "run_id", "key", "probe_id"):
        op.drop_index(f"ix_probes_{name}", table_name="probes")
    op.drop_table("probes")
    for name in ("status", "created_at", "run_id"):
        op.drop_index(f"ix_probe_runs_{name}", table_name="probe_runs")
    op.drop_table("probe_runs")
