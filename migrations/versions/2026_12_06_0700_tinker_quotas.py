"""a tenant's own Tinker API limits

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 07:00:00.000000

- ``tenants.quota_tinker_models_per_base``, ``quota_tinker_calls_in_flight``,
  ``quota_tinker_tokens_per_minute``: the tenant's own Tinker limits; NULL: the
  deployment's ``RLAAS_TINKER_*`` setting; 0: no limit for this tenant (as the setting's 0).
  Tokens a minute is a BIGINT, as the byte quotas are: past 2**31 a minute is a large pool's
  ask, not a mistake.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("quota_tinker_models_per_base", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("quota_tinker_calls_in_flight", sa.Integer(), nullable=True))
        batch.add_column(
            sa.Column("quota_tinker_tokens_per_minute", sa.BigInteger(), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("quota_tinker_tokens_per_minute")
        batch.drop_column("quota_tinker_calls_in_flight")
        batch.drop_column("quota_tinker_models_per_base")
