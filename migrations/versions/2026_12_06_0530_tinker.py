"""Tinker-compatible API: LoRA models, futures, sampling sessions

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 05:30:00.000000

- ``tinker_workers``: model workers that registered their URL (and secret, encrypted);
- ``tinker_models``: a tenant's LoRA model (``/api/v1/create_model``), on its worker;
- ``tinker_futures``: every work call's result (or error), read by ``retrieve_future``;
- ``tinker_samplers``: sampling sessions, on a base model or saved sampler weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _owned(name: str, *columns: sa.schema.SchemaItem) -> None:
    op.create_table(
        name,
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        *columns,
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f(f"fk_{name}_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{name}")),
    )
    op.create_index(op.f(f"ix_{name}_tenant_id"), name, ["tenant_id"], unique=False)


def upgrade() -> None:
    op.create_table(
        "tinker_workers",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("url", sa.String(length=1024), nullable=False),
        sa.Column("token_sealed", sa.Text(), nullable=False),
        sa.Column("bases", sa.JSON(), nullable=False),
        sa.Column("credential_id", sa.String(length=40), nullable=True),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tinker_workers")),
    )
    _owned(
        "tinker_models",
        sa.Column("worker_id", sa.String(length=40), nullable=True),
        sa.ForeignKeyConstraint(
            ["worker_id"],
            ["tinker_workers.id"],
            name=op.f("fk_tinker_models_worker_id_tinker_workers"),
            ondelete="SET NULL",
        ),
        sa.Column("base_model", sa.String(length=1024), nullable=False),
        sa.Column("lora_rank", sa.Integer(), nullable=False),
    )
    _owned(
        "tinker_futures",
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("result", sa.LargeBinary(), nullable=True),
        sa.Column("media_type", sa.String(length=64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_category", sa.String(length=16), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    _owned(
        "tinker_samplers",
        sa.Column("base_model", sa.String(length=1024), nullable=False),
        sa.Column("model_path", sa.String(length=1024), nullable=True),
    )


def downgrade() -> None:
    for name in ("tinker_samplers", "tinker_futures", "tinker_models"):
        op.drop_index(op.f(f"ix_{name}_tenant_id"), table_name=name)
        op.drop_table(name)
    op.drop_table("tinker_workers")
