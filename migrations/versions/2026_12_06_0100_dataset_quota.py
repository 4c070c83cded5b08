"""a tenant's own dataset quota

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 01:00:00.000000

- ``tenants.quota_dataset_bytes``: the bytes all of the tenant's uploaded datasets may
  take; NULL: the deployment's ``RLAAS_QUOTA_DATASET_BYTES``. A BIGINT, unlike the other
  quota columns: a quota past 2 GiB is an ordinary ask.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("quota_dataset_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("quota_dataset_bytes")
