"""runs.gateway_token_previous_encrypted: the last attempt's gateway token, kept after a
claim, so a session's call that carries a key of the attempt that died is told its session
was lost to the restart (410, play the episode again) instead of an unknown session's 404

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 21:40:00.000000

See docs/sessions.md ("Sessions through the API").
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("gateway_token_previous_encrypted", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("gateway_token_previous_encrypted")
