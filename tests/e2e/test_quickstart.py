"""`rlaas quickstart --exit-when-done` on an empty data folder, as a new user would run it.

Embedded default only: SQLite files and the server-less broker, no Postgres
or Redis. The second invocation reuses the folder (same tenant key).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e.stack import REPO, rlaas

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(6)]


def quickstart(data_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLAAS_")}
    env["RLAAS_DATA_DIR"] = str(data_dir)
    return subprocess.run(
        [*rlaas(), "quickstart", "--exit-when-done", "--port", "0", *extra],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_quickstart_runs_a_spec_to_success_and_reuses_its_folder(tmp_path: Path) -> None:
    data = tmp_path / "rlaas-data"
    # The short example cut to 4 steps: what is proven here is the command's path (start,
    # submit, wait, exit 0, a folder reused), and each step more is CI time proving nothing.
    spec = yaml.safe_load((REPO / "examples" / "tiny-game-short.yaml").read_text())
    spec["train"]["steps"] = 4
    short = str(tmp_path / "tiny-game-4-steps.yaml")
    Path(short).write_text(yaml.safe_dump(spec))
    first = quickstart(data, "--spec", short)
    logs = "\n".join(p.read_text() for p in (data / "logs").glob("*.log"))
    assert first.returncode == 0, f"{first.stdout}\n{first.stderr}\n{logs}"
    assert "succeeded" in first.stderr
    assert (data / "rlaas.db").exists() and (data / "broker.db").exists()
    key = (data / "quickstart.key").read_text()

    second = quickstart(data, "--spec", short)
    assert second.returncode == 0, second.stderr
    assert (data / "quickstart.key").read_text() == key
