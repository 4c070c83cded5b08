"""Which bearer token a worker claims with: its own credential first, then the shared
token (deprecated), then the embedded control plane's token file."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.settings import WorkerSettings


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RLAAS_WORKER_CREDENTIAL", "RLAAS_WORKER_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def test_the_credential_comes_first_then_the_shared_token_then_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RLAAS_DATA_DIR", str(tmp_path))
    (tmp_path / "worker_token").write_text("from-the-embedded-file\n")
    assert WorkerSettings().resolved_worker_token() == "from-the-embedded-file"
    monkeypatch.setenv("RLAAS_WORKER_TOKEN", "shared")
    assert WorkerSettings().resolved_worker_token() == "shared"
    monkeypatch.setenv("RLAAS_WORKER_CREDENTIAL", "rlaas_worker_0123456789ab_mine")
    assert WorkerSettings().resolved_worker_token() == "rlaas_worker_0123456789ab_mine"


def test_a_worker_with_nothing_says_how_to_enrol(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RLAAS_DATA_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="rlaas workers issue NAME"):
        WorkerSettings().resolved_worker_token()
