"""results, environments, quotas

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 16:44:23.987733
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "environments",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret_encrypted", sa.Text(), nullable=False),
        sa.Column("timeout_s", sa.Float(), nullable=False),
        sa.Column("max_concurrency", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_environments_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_environments")),
        sa.UniqueConstraint("tenant_id", "name", name="uq_environments_tenant_name"),
    )
    op.create_index(op.f("ix_environments_tenant_id"), "environments", ["tenant_id"], unique=False)
    op.create_table(
        "artifacts",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_artifacts_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "kind", "step", name=op.f("pk_artifacts")),
    )
    op.create_table(
        "env_callbacks",
        sa.Column("episode_id", sa.String(length=300), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("environment_id", sa.String(length=40), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["environment_id"],
            ["environments.id"],
            name=op.f("fk_env_callbacks_environment_id_environments"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_env_callbacks_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("episode_id", "step", name=op.f("pk_env_callbacks")),
    )
    op.create_index(op.f("ix_env_callbacks_run_id"), "env_callbacks", ["run_id"], unique=False)
    op.create_table(
        "spans",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("track", sa.String(length=300), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("start_us", sa.BigInteger(), nullable=False),
        sa.Column("dur_us", sa.BigInteger(), nullable=False),
        sa.Column("args", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_spans_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_spans")),
    )
    op.create_index("ix_spans_run_start", "spans", ["run_id", "start_us"], unique=False)
    op.create_table(
        "trajectories",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("episode_id", sa.String(length=300), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=False),
        sa.Column("reward", sa.Float(), nullable=False),
        sa.Column("end_state", sa.String(length=16), nullable=False),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_trajectories_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trajectories")),
    )
    op.create_index(
        "ix_trajectories_run_step", "trajectories", ["run_id", "step", "id"], unique=False
    )
    op.add_column("runs", sa.Column("inflight", sa.JSON(), nullable=True))
    op.add_column("runs", sa.Column("inflight_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("runs", sa.Column("profile_steps_requested", sa.Integer(), nullable=True))
    op.add_column("tenants", sa.Column("quota_runs_in_flight", sa.Integer(), nullable=True))
    op.add_column("tenants", sa.Column("quota_requests_per_minute", sa.Integer(), nullable=True))
    op.add_column("tenants", sa.Column("quota_body_bytes", sa.Integer(), nullable=True))


def downgrade() -> None:

    op.drop_column("tenants", "quota_body_bytes")
    op.drop_column("tenants", "quota_requests_per_minute")
    op.drop_column("tenants", "quota_runs_in_flight")
    op.drop_column("runs", "profile_steps_requested")
    op.drop_column("runs", "inflight_at")
    op.drop_column("runs", "inflight")
    op.drop_index("ix_trajectories_run_step", table_name="trajectories")
    op.drop_table("trajectories")
    op.drop_index("ix_spans_run_start", table_name="spans")
    op.drop_table("spans")
    op.drop_index(op.f("ix_env_callbacks_run_id"), table_name="env_callbacks")
    op.drop_table("env_callbacks")
    op.drop_table("artifacts")
    op.drop_index(op.f("ix_environments_tenant_id"), table_name="environments")
    op.drop_table("environments")
