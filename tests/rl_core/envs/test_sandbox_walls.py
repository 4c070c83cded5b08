"""Which wall tenant code runs behind, with bubblewrap here and without it.

"Without" is real, not a patched function: PATH is set to a folder that holds
``unshare`` and ``true`` but no ``bwrap`` (so `shutil.which` finds no bubblewrap and the
namespace wall still works), and the cached probes are cleared on the way in and out.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_core.envs import Action
from rl_core.envs.code_exec import CodeExec
from rl_core.envs.sandbox import bwrap_problem, namespaces_available
from rl_core.envs.walls import (
    MULTI_TENANT,
    SINGLE_USER,
    WallPolicy,
    assess,
    operator_accepts_weak_wall,
)
from rl_core.errors import EnvironmentFailure, SandboxRefused

ANSWER = Action(content="```python\ndef add(a, b):\n    return a + b\n```")
REFUSING = WallPolicy(weak_wall="refuse", opt_out="OPT_OUT=1")


def forget_probes() -> None:
    bwrap_problem.cache_clear()
    namespaces_available.cache_clear()


def path_without_bwrap(folder: Path) -> str:
    folder.mkdir(exist_ok=True)
    for tool in ("unshare", "true"):
        found = shutil.which(tool)
        assert found, f"{tool} is needed on this machine"
        (folder / tool).symlink_to(found)
    return str(folder)


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("PATH", path_without_bwrap(tmp_path / "bin"))
    forget_probes()
    yield
    monkeypatch.undo()
    forget_probes()


@pytest.fixture
def bwrap_here() -> None:
    forget_probes()
    assert bwrap_problem() is None, f"these tests need bubblewrap: {bwrap_problem()}"


def play(env: CodeExec) -> tuple[dict[str, object], dict[str, object]]:
    async def main() -> tuple[dict[str, object], dict[str, object]]:
        reset = await env.reset("e", 0, {"tasks": ["add"]})
        step = await env.step("e", 1, ANSWER)
        assert step.reward == 1.0, step.info
        return dict(reset.info), dict(step.info)

    return asyncio.run(main())


@pytest.mark.parametrize("policy", [MULTI_TENANT, SINGLE_USER], ids=["deployed", "single-user"])
def test_with_bubblewrap_every_host_runs_tenant_code_behind_it(
    bwrap_here: None, policy: WallPolicy
) -> None:
    report = assess(policy)
    assert (report.wall, report.tenant_code, report.weak) == ("bwrap", "runs", False)
    reset, step = play(CodeExec(policy))
    assert reset["isolation"] == step["isolation"] == "bwrap"
    assert "sandbox_warning" not in reset


def test_without_bubblewrap_a_deployed_host_refuses_at_the_first_reset(no_bwrap: None) -> None:
    env = CodeExec(REFUSING)
    with pytest.raises(SandboxRefused) as refused:
        asyncio.run(env.reset("e", 0, {"tasks": ["add"]}))
    message = str(refused.value)
    assert not isinstance(refused.value, EnvironmentFailure)  # the run's failure, not an episode's
    assert "bubblewrap is not installed" in message  # what is missing
    assert "install Debian's `bubblewrap`" in message and "unprivileged_userns" in message
    assert "OPT_OUT=1" in message  # and the one way to accept less
    assert assess(REFUSING).tenant_code == "refused"


@pytest.mark.parametrize(
    ("policy", "accepted_by"),
    [
        (SINGLE_USER, "single-user"),
        (operator_accepts_weak_wall("RLAAS_UNSAFE_SANDBOX_WITHOUT_BWRAP=1"), "RLAAS_UNSAFE"),
    ],
    ids=["single-user", "operator-opt-out"],
)
def test_without_bubblewrap_an_accepted_weak_wall_runs_with_a_warning(
    no_bwrap: None, policy: WallPolicy, accepted_by: str, caplog: pytest.LogCaptureFixture
) -> None:
    reset, step = play(CodeExec(policy))
    wall = "namespace" if namespaces_available() else "audit"
    assert reset["isolation"] == step["isolation"] == wall
    warning = str(reset["sandbox_warning"])
    assert warning.startswith("sandbox wall: WEAK") and accepted_by in warning
    assert "not a wall between tenants" in warning
    assert [r.levelname for r in caplog.records if "WEAK" in r.getMessage()] == ["WARNING"]


def test_a_refusing_host_never_falls_back_when_bubblewrap_stops_mid_run(
    bwrap_here: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = CodeExec(REFUSING)

    async def main() -> None:
        await env.reset("e", 0, {"tasks": ["add"]})
        monkeypatch.setenv("PATH", path_without_bwrap(tmp_path / "bin"))
        forget_probes()  # bubblewrap gone after the reset (uninstalled, namespaces turned off)
        await env.step("e", 1, ANSWER)

    try:
        with pytest.raises(SandboxRefused, match="bubblewrap is not installed"):
            asyncio.run(main())
    finally:
        monkeypatch.undo()
        forget_probes()
    assert bwrap_problem() is None  # and back for the tests after this one
