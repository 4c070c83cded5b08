"""Session-wide real services: PostgreSQL 15 and Redis.

CI starts them once (``scripts/services.sh``) and passes their URLs in
``RLAAS_TEST_DATABASE_URL`` / ``RLAAS_TEST_REDIS_URL``; without those, the
first test that asks starts its own pair for the session. Nothing here is
autouse: tests of ``rl_core`` need no database.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    """XLA's compiled programs shared by the whole run, as ``rlaas worker`` shares them
    between runs (rl_core.host.compile_cache): both test processes and the workers the
    end-to-end tests start use one folder, so a program is compiled once, not per test.
    ``RLAAS_JAX_CACHE_PATH=off`` compiles everything afresh."""
    from rl_core.host.compile_cache import folder_of, use_compilation_cache

    use_compilation_cache(folder_of(os.environ.get("RLAAS_JAX_CACHE_PATH")))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with minutes-long tests first, the longest first.

    pytest-xdist hands out whole files (``--dist loadfile``) in collection order
    (``--no-loadscope-reorder``; its own order puts files with the most tests first,
    which left the one-test, five-minute end-to-end files to the end of the run,
    with one process idle). Longest first keeps both processes busy to the end.
    """

    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    estimate: dict[str, float] = {}
    for item in items:
        marker = item.get_closest_marker("minutes")
        minutes = float(marker.args[0]) if marker else 0.0
        estimate[file_of(item)] = max(estimate.get(file_of(item), 0.0), minutes)
    items.sort(key=lambda item: -estimate[file_of(item)])


@pytest.fixture(scope="module", autouse=True)
def _collect_clients_between_files() -> Iterator[None]:
    """Collect a file's garbage once it is done, while no event loop runs.

    The ``openai`` client closes itself when it is collected by scheduling ``aclose`` on
    whatever loop is running then: collected during a later file's async test, that is
    another loop than its connections', and the close fails there ("Event loop is
    closed", raised into that test). Frameworks (LangChain, openai-agents, verifiers)
    make such clients and leave them open, so files that imported ``openai`` are
    collected here, outside any loop, where the client's close does nothing.
    """
    yield
    if "openai" in sys.modules:
        gc.collect()


@pytest.fixture(scope="session")
def _services() -> Iterator[dict[str, str]]:
    wanted = ("RLAAS_TEST_DATABASE_URL", "RLAAS_TEST_REDIS_URL")
    if all(os.environ.get(k) for k in wanted):
        yield {k: os.environ[k] for k in wanted}
        return
    # Under /tmp, not pytest's tmp_path: the postgres OS user must be able to reach it.
    folder = tempfile.mkdtemp(prefix="rlaas-test-services-", dir="/tmp")
    script = str(REPO / "scripts" / "services.sh")
    try:
        started = subprocess.run([script, "start", folder], capture_output=True, text=True)
        if started.returncode != 0:
            pytest.fail(f"scripts/services.sh start failed:\n{started.stderr}", pytrace=False)
        urls: dict[str, str] = {}
        for line in Path(folder, "env").read_text().splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            urls[name] = value
        yield urls
    finally:
        subprocess.run([script, "stop", folder], check=False, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url(_services: dict[str, str]) -> str:
    return _services["RLAAS_TEST_DATABASE_URL"]


@pytest.fixture(scope="session")
def redis_url(_services: dict[str, str]) -> str:
    return _services["RLAAS_TEST_REDIS_URL"]


@pytest.fixture(scope="session")
def mlflow_url() -> Iterator[str]:
    """A real MLflow tracking server (tests/mlflow_server.py), one per test process;
    ``RLAAS_TEST_MLFLOW_URL`` names one already running instead."""
    given = os.environ.get("RLAAS_TEST_MLFLOW_URL")
    if given:
        yield given
        return
    from tests.mlflow_server import mlflow_server

    with mlflow_server() as url:
        yield url


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3-speaking server (moto's, tests/s3_server.py), one per test process;
    ``RLAAS_TEST_S3_URL`` names one already running instead."""
    given = os.environ.get("RLAAS_TEST_S3_URL")
    if given:
        yield given
        return
    from tests.s3_server import s3_server

    with s3_server() as url:
        yield url


@pytest.fixture
def s3_store_url(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``s3://<a fresh bucket>/runs`` on that server, with its credentials in the
    environment as a deployment sets them (``AWS_*``) and ``RLAAS_S3_ENDPOINT``."""
    from tests.s3_server import CREDENTIALS, new_bucket

    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RLAAS_S3_ENDPOINT", s3_endpoint)
    return f"s3://{new_bucket(s3_endpoint)}/runs"
