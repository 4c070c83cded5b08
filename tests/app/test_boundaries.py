"""The control plane's boundaries: no JAX in its process, the schema owned by Alembic."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg

from app import state

REPO = Path(__file__).resolve().parents[2]


def test_app_main_loads_no_jax() -> None:
    code = (
        "import sys, app.main; "
        "sys.exit(sorted(m for m in ('jax', 'jaxlib', 'flax', 'optax') if m in sys.modules) or 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def alembic(url: str, *args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RLAAS_DATABASE_URL": url, "RLAAS_DATA_DIR": str(data_dir)}
    return subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_migrations_build_the_models_schema_on_postgres_and_sqlite(
    postgres_url: str, tmp_path: Path
) -> None:
    name = f"mig_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    urls = [
        f"{postgres_url.rpartition('/')[0]}/{name}",
        f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}",
    ]
    for url in urls:
        for args in (("upgrade", "head"), ("check",)):
            result = alembic(url, *args, data_dir=tmp_path)
            assert result.returncode == 0, f"{url} alembic {args}: {result.stderr}"
        assert "No new upgrade operations detected" in result.stdout + result.stderr


def test_state_machine_table() -> None:
    legal = {(a, b) for a, targets in state.ALLOWED.items() for b in targets}
    assert ("queued", "starting") in legal and ("running", "succeeded") in legal
    assert ("running", "queued") in legal  # re-enqueue after a lost lease
    for terminal in state.TERMINAL:
        assert not state.ALLOWED[terminal]
    assert not state.can_transition("queued", "running")  # must be claimed first
    assert not state.can_transition("queued", "succeeded")
    assert set(state.ALLOWED) == set(state.ALL)
