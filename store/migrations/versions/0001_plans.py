"""plans: one row per saved plan, indexed by creation time and workload kind.

Revision ID: 0001
Revises:
Create Date: 2024-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create ``plans`` and its indexes."""
    op.create_table(
        "plans",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("plan_id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("fits", sa.Boolean(), nullable=False),
        sa.Column("workload", sa.JSON(), nullable=False),
        sa.Column("hardware", sa.JSON(), nullable=False),
        sa.Column("strategy", sa.JSON(), nullable=False),
        sa.Column("predicted", sa.JSON(), nullable=False),
        sa.Column("ds_config", sa.JSON(), nullable=False),
        sa.Column("document", sa.JSON(), nullable=False),
    )
    op.create_index("ix_plans_plan_id", "plans", ["plan_id"], unique=True)
    op.create_index("ix_plans_created_at", "plans", ["created_at"])
    op.create_index("ix_plans_kind", "plans", ["kind"])


def downgrade() -> None:
    """Drop ``plans``."""
    op.drop_index("ix_plans_kind", table_name="plans")
    op.drop_index("ix_plans_created_at", table_name="plans")
    op.drop_index("ix_plans_plan_id", table_name="plans")
    op.drop_table("plans")
