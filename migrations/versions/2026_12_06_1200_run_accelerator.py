"""the accelerator each run is routed to

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 12:00:00.000000

- ``runs.accelerator``: the accelerator the run was admitted to (cpu, gpu, tpu), whose
  queue it is sent to (``RLAAS_QUEUES``) and among whose runs a fair claim chooses.
  Existing rows stay NULL: runs from before, which go to the deployment's default
  accelerator (where every run went then).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("accelerator", sa.String(length=16), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "accelerator")
