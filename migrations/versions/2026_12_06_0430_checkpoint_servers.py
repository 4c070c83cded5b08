"""checkpoint servers

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 04:30:00.000000

- ``checkpoint_servers``: a run's checkpoint being served for chat completions
  (docs/serving.md): one row per (run, step), made when the API asks a worker to load it,
  with the secret the worker's server takes (encrypted) and, once the worker has loaded
  it, the URL the API proxies to. The worker deletes the row when it stops;
  ``error``: why it could not load the checkpoint, told to the next call.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "checkpoint_servers",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("token_encrypted", sa.Text(), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=True),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ready_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_checkpoint_servers_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoint_servers")),
        sa.UniqueConstraint("run_id", "step", name="uq_checkpoint_servers_run_step"),
    )


def downgrade() -> None:
    op.drop_table("checkpoint_servers")
