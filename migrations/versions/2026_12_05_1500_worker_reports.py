"""worker reports: each worker's sandbox wall, for /readyz

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 15:00:00.000000

- ``worker_reports``: a worker's queue and the sandbox wall it runs tenant code behind
  (``bwrap``, or a weaker one with tenant code ``refused`` or ``runs_on_weak_wall``), as
  it last reported them (at start-up, and with each claim).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "worker_reports",
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column("queue", sa.String(length=200), nullable=True),
        sa.Column("sandbox_wall", sa.String(length=16), nullable=False),
        sa.Column("tenant_code", sa.String(length=24), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_worker_reports")),
    )


def downgrade() -> None:
    op.drop_table("worker_reports")
