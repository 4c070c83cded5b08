"""env_callbacks: a row per awaited step (awaited_until), its result optional

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04 21:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Batch mode: SQLite cannot ALTER a column's nullability in place (Postgres gets ALTERs).
    with op.batch_alter_table("env_callbacks") as batch:
        batch.add_column(sa.Column("awaited_until", sa.DateTime(timezone=True), nullable=True))
    # A result stored before this revision was awaited, at the latest, when it came.
    op.execute("UPDATE env_callbacks SET awaited_until = received_at")
    with op.batch_alter_table("env_callbacks") as batch:
        batch.alter_column(
            "awaited_until", existing_type=sa.DateTime(timezone=True), nullable=False
        )
        batch.alter_column("body", existing_type=sa.JSON(), nullable=True)
        batch.alter_column("received_at", existing_type=sa.DateTime(timezone=True), nullable=True)
        batch.alter_column("environment_id", existing_type=sa.String(length=40), nullable=True)
        batch.create_index(batch.f("ix_env_callbacks_awaited_until"), ["awaited_until"])


def downgrade() -> None:
    # Rows without a result (a step still awaited) have no place in the old table.
    op.execute("DELETE FROM env_callbacks WHERE received_at IS NULL OR environment_id IS NULL")
    with op.batch_alter_table("env_callbacks") as batch:
        batch.drop_index(batch.f("ix_env_callbacks_awaited_until"))
        batch.alter_column("environment_id", existing_type=sa.String(length=40), nullable=False)
        batch.alter_column("received_at", existing_type=sa.DateTime(timezone=True), nullable=False)
        batch.alter_column("body", existing_type=sa.JSON(), nullable=False)
        batch.drop_column("awaited_until")
