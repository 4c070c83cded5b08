"""scripts/services.sh: a throwaway PostgreSQL and Redis, started and stopped cleanly."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg
import redis

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "scripts" / "services.sh")


def services(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, check=False)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_start_writes_the_env_file_and_stop_is_safe_to_repeat() -> None:
    folder = tempfile.mkdtemp(prefix="rlaas-services-test-")
    try:
        started = services("start", folder)
        assert started.returncode == 0, started.stderr
        urls = dict(
            line.removeprefix("export ").split("=", 1)
            for line in Path(folder, "env").read_text().splitlines()
        )
        assert started.stdout.strip() == Path(folder, "env").read_text().strip()
        db_url, redis_url = urls["RLAAS_TEST_DATABASE_URL"], urls["RLAAS_TEST_REDIS_URL"]
        assert db_url.startswith("postgresql+psycopg://rlaas@127.0.0.1:") and db_url.endswith(
            "/rlaas"
        )
        with psycopg.connect(db_url.replace("+psycopg", ""), autocommit=True) as conn:
            # The role may create databases: the tests make one per session.
            conn.execute("CREATE DATABASE scratch")
            version = conn.execute("SHOW server_version").fetchone()
        assert version is not None and version[0].startswith("15")
        assert redis.Redis.from_url(redis_url).ping()

        pg_port = int(db_url.rsplit(":", 1)[1].split("/")[0])
        redis_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
        for _ in range(2):
            stopped = services("stop", folder)
            assert stopped.returncode == 0, stopped.stderr
        assert not port_open(pg_port) and not port_open(redis_port)
        assert not Path(folder, "env").exists()
    finally:
        services("stop", folder)
        shutil.rmtree(folder, ignore_errors=True)


def test_stop_on_a_folder_where_nothing_started_is_a_no_op(tmp_path: Path) -> None:
    assert services("stop", str(tmp_path)).returncode == 0
    assert services("stop", str(tmp_path / "never-made")).returncode == 0
    assert services("frobnicate", str(tmp_path)).returncode == 2
