"""worker credentials: one per worker, issued and revoked by the operator

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 22:00:00.000000

- ``worker_credentials``: a worker's own credential (``rlaas workers issue``), kept as
  its SHA-256 with a clear prefix that finds the row; revoked, never deleted.
- ``runs.lease_credential_id``: the credential whose holder claimed the current lease
  (NULL: the shared token did), so that revoking a credential ends its leases.

See docs/lifecycle.md, "Worker credentials".
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "worker_credentials",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_worker_credentials")),
        sa.UniqueConstraint("prefix", name=op.f("uq_worker_credentials_prefix")),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("lease_credential_id", sa.String(length=40), nullable=True))
        batch.create_index(
            batch.f("ix_runs_lease_credential_id"), ["lease_credential_id"], unique=False
        )
        batch.create_foreign_key(
            batch.f("fk_runs_lease_credential_id_worker_credentials"),
            "worker_credentials",
            ["lease_credential_id"],
            ["id"],
            ondelete="SET NULL",
        )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint(
            batch.f("fk_runs_lease_credential_id_worker_credentials"), type_="foreignkey"
        )
        batch.drop_index(batch.f("ix_runs_lease_credential_id"))
        batch.drop_column("lease_credential_id")
    op.drop_table("worker_credentials")
