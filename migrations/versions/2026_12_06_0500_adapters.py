"""uploaded adapters, stored artifact bytes

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 05:00:00.000000

- ``adapters``: a PEFT LoRA adapter a tenant uploaded (POST /v1/adapters) for
  ``model.lora.init_from: adapter:<id>``; its files are in the data folder.
- ``runs.stored_bytes``: what a run's kept checkpoints and exports take, reported by its
  worker with each checkpoint; ``tenants.quota_artifact_bytes``: the tenant's cap on those
  and its adapters together (NULL: the deployment's ``RLAAS_QUOTA_ARTIFACT_BYTES``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "adapters",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("alpha", sa.Float(), nullable=False),
        sa.Column("targets", sa.JSON(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_adapters_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapters")),
    )
    op.create_index(op.f("ix_adapters_tenant_id"), "adapters", ["tenant_id"], unique=False)
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("stored_bytes", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("quota_artifact_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("quota_artifact_bytes")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("stored_bytes")
    op.drop_index(op.f("ix_adapters_tenant_id"), table_name="adapters")
    op.drop_table("adapters")
