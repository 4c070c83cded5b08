"""runs: the hash of the lease token, the credential of a run's worker routes

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05 09:00:00.000000

A run leased before this revision has no hash, so its worker (of the version before,
which sends the shared worker token) is refused from now on, and the run is re-queued
when its lease expires: upgrade the API and the workers together.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("lease_token_hash", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("lease_token_hash")
