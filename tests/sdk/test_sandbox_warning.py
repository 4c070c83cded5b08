"""`rlaas train` (a code_exec spec) and `rlaas quickstart` tell the user when their
model's code will run behind a wall weaker than bubblewrap; with bubblewrap they say
nothing. Bubblewrap's absence is real (a PATH without it, as in
tests/rl_core/envs/test_sandbox_walls.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sdk import cli, quickstart
from tests.rl_core.envs.test_sandbox_walls import forget_probes, path_without_bwrap

WARNINGS: dict[str, Callable[[], None]] = {
    "rlaas train": cli._warn_of_a_weak_sandbox,
    "rlaas quickstart": quickstart._warn_of_a_weak_sandbox,
}


@pytest.fixture(autouse=True)
def embedded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for name in ("RLAAS_BROKER_URL", "RLAAS_UNSAFE_SANDBOX_WITHOUT_BWRAP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RLAAS_DATA_DIR", str(tmp_path / "data"))
    forget_probes()
    yield
    monkeypatch.undo()
    forget_probes()


@pytest.mark.parametrize("command", list(WARNINGS))
def test_without_bubblewrap_the_user_is_warned(
    command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", path_without_bwrap(tmp_path / "bin"))
    forget_probes()
    WARNINGS[command]()
    said = " ".join(capfd.readouterr().err.split())  # rich wraps its lines
    assert said.startswith("warning: sandbox wall: WEAK"), said
    assert "not a wall between tenants" in said and "install Debian's `bubblewrap`" in said


@pytest.mark.parametrize("command", list(WARNINGS))
def test_with_bubblewrap_nothing_is_said(command: str, capfd: pytest.CaptureFixture[str]) -> None:
    WARNINGS[command]()
    assert capfd.readouterr().err == ""
