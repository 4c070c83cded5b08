"""fairness between tenants: fair claims, a shared request bucket, a compute budget,
a limit on the time a run may wait in the queue

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05 10:00:00.000000

- ``tenants.last_claim_at``: when a worker last took one of the tenant's runs; the fair
  claim serves the tenant waited on longest first.
- ``tenants.quota_run_seconds`` and ``quota_train_steps``: overrides of the compute
  budget per period and of the cap on one run's ``train.steps``.
- ``runs.queued_at``: when the run last entered ``queued`` (submitted or re-queued); the
  reaper fails a run that has waited longer than ``RLAAS_MAX_QUEUED_S``. Runs queued now
  take the time of their newest move into ``queued``.
- ``request_buckets``: each tenant's request-rate bucket, shared by every API process.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("last_claim_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("quota_run_seconds", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("quota_train_steps", sa.Integer(), nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE runs SET queued_at = (SELECT max(e.created_at) FROM run_events e "
        "WHERE e.run_id = runs.id AND e.to_status = 'queued') WHERE status = 'queued'"
    )
    op.create_table(
        "request_buckets",
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("tat", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_request_buckets_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_request_buckets")),
    )


def downgrade() -> None:
    op.drop_table("request_buckets")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("queued_at")
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("quota_train_steps")
        batch.drop_column("quota_run_seconds")
        batch.drop_column("last_claim_at")
