"""The control plane's boundaries: no JAX in its process, the schema owned by Alembic."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.app.conftest import fresh_database

REPO = Path(__file__).resolve().parents[2]
TABLES = {"tenants", "api_keys", "runs", "run_events", "metric_points", "ingest_batches"}


def test_app_main_loads_no_jax() -> None:
    code = (
        "import sys, app.main; "
        "loaded = sorted(m for m in ('jax', 'jaxlib', 'flax', 'optax', 'worker') "
        "if m in sys.modules); "
        "print(loaded); sys.exit(1 if loaded else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=REPO
    )
    assert result.returncode == 0, result.stdout + result.stderr


def alembic(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(REPO / "alembic.ini"), *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_migrations_build_the_models_schema_with_no_drift(
    backend: str, postgres_url: str, tmp_path: Path
) -> None:
    url = (
        fresh_database(postgres_url, "mig")
        if backend == "postgres"
        else f"sqlite+aiosqlite:///{tmp_path / 'nested' / 'fresh.db'}"
    )
    env = {"RLAAS_DATABASE_URL": url, "RLAAS_DATA_DIR": str(tmp_path / "data")}
    for args in (("upgrade", "head"), ("check",), ("downgrade", "base"), ("upgrade", "head")):
        result = alembic(REPO, env, *args)
        assert result.returncode == 0, f"alembic {args} on {backend}: {result.stderr}"
    check = alembic(REPO, env, "check")
    assert check.returncode == 0
    assert "No new upgrade operations detected" in check.stdout + check.stderr


def test_alembic_takes_the_url_from_x_arguments(tmp_path: Path) -> None:
    db = tmp_path / "from-x.db"
    env = {"RLAAS_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'not-this.db'}"}
    result = alembic(
        tmp_path, env, "-x", f"database_url=sqlite+aiosqlite:///{db}", "upgrade", "head"
    )
    assert result.returncode == 0, result.stderr
    assert db.exists() and not (tmp_path / "not-this.db").exists()


def test_admin_migrate_works_from_any_folder_on_the_embedded_default(tmp_path: Path) -> None:
    data_dir = tmp_path / "fresh" / "data"  # does not exist yet
    code = "from app.admin import migrate; from app.settings import Settings; migrate(Settings())"
    env = {
        k: v for k, v in os.environ.items() if k not in ("RLAAS_DATABASE_URL", "RLAAS_BROKER_URL")
    }
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**env, "RLAAS_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    with sqlite3.connect(data_dir / "rlaas.db") as conn:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert names >= TABLES | {"alembic_version"}
