"""runs: the gateway of a sessions run (its URL on the worker, its token encrypted)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04 22:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("gateway_url", sa.String(length=2048), nullable=True))
        batch.add_column(sa.Column("gateway_token_encrypted", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("gateway_token_encrypted")
        batch.drop_column("gateway_url")
