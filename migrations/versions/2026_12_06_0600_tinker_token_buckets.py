"""Tinker-compatible API: each tenant's tokens-per-minute bucket

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 06:00:00.000000

- ``tinker_token_buckets``: the tokens a tenant's Tinker work calls may still spend
  (``RLAAS_TINKER_TOKENS_PER_MINUTE``), shared by every API process: the same GCRA
  arrival time as ``request_buckets``, counted in tokens rather than requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tinker_token_buckets",
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("tat", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_tinker_token_buckets_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_tinker_token_buckets")),
    )


def downgrade() -> None:
    op.drop_table("tinker_token_buckets")
