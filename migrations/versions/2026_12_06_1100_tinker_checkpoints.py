"""Tinker-compatible API: saved training state (save_weights / load_weights)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 11:00:00.000000

- ``tinker_checkpoints``: a model's saved adapter, Adam moments and step count, a folder
  of the artifact store under the tenant's prefix; it outlives the model and its worker,
  and its bytes count in the tenant's ``artifact_bytes`` quota.
- ``tinker_models.id`` widens to 128: a model made from a saved state is named by the SDK
  itself, ``<session id>:train:<n>``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tinker_checkpoints",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("model_id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("store_key", sa.String(length=1024), nullable=False),
        sa.Column("base_model", sa.String(length=1024), nullable=False),
        sa.Column("lora_rank", sa.Integer(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("user_metadata", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_tinker_checkpoints_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tinker_checkpoints")),
        sa.UniqueConstraint("path", name=op.f("uq_tinker_checkpoints_path")),
    )
    op.create_index(
        op.f("ix_tinker_checkpoints_tenant_id"), "tinker_checkpoints", ["tenant_id"], unique=False
    )
    op.create_index(
        op.f("ix_tinker_checkpoints_model_id"), "tinker_checkpoints", ["model_id"], unique=False
    )
    with op.batch_alter_table("tinker_models") as batch:
        batch.alter_column("id", existing_type=sa.String(length=40), type_=sa.String(length=128))


def downgrade() -> None:
    with op.batch_alter_table("tinker_models") as batch:
        batch.alter_column("id", existing_type=sa.String(length=128), type_=sa.String(length=40))
    op.drop_index(op.f("ix_tinker_checkpoints_model_id"), table_name="tinker_checkpoints")
    op.drop_index(op.f("ix_tinker_checkpoints_tenant_id"), table_name="tinker_checkpoints")
    op.drop_table("tinker_checkpoints")
