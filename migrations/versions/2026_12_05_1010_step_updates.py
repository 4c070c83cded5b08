"""step_updates: each policy update a worker applied, linked to the policy it was applied to

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 10:00:00.000000

The final policy's lineage (which attempt's update of each step it holds) is read from
these links; see docs/lifecycle.md, "Steps redone after a resume".
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "step_updates",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("base_step", sa.Integer(), nullable=False),
        sa.Column("base_attempt", sa.Integer(), nullable=False),
        sa.Column("optimizer_updates", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_step_updates_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "step", "attempt", name=op.f("pk_step_updates")),
    )


def downgrade() -> None:
    op.drop_table("step_updates")
