"""rl_core/host/lifeline.py, with real processes: a command in a session of its own ends
when the process that started it dies without stopping it, and not before; while its
owner lives, the lifeline passes its exit status back and leaves its stop graceful."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rl_core.host import lifeline


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def wait_gone(pid: int, timeout_s: float) -> float:
    started = time.monotonic()
    while alive(pid):
        assert time.monotonic() - started < timeout_s, f"{pid} still runs after {timeout_s} s"
        time.sleep(0.05)
    return time.monotonic() - started


# An owner process: starts `sleeper` through a lifeline in a new session, as VllmServer
# does, prints the lifeline's and the sleeper's pids, then sleeps until it is killed.
OWNER = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from rl_core.host import lifeline
    grace, script = float(sys.argv[1]), sys.argv[2]
    cmd = lifeline.command(__import__("os").getpid(), [sys.executable, "-c", script], grace)
    p = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE)
    child = int(p.stdout.readline())
    print(json.dumps({"lifeline": p.pid, "child": child}), flush=True)
    time.sleep(600)
    """
)
SLEEPER = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
STUBBORN = (
    "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print(os.getpid(), flush=True); time.sleep(600)"
)


def start_owner(script: str, grace_s: float) -> tuple[subprocess.Popen[str], dict[str, int]]:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(grace_s), script], stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    pids = json.loads(owner.stdout.readline())
    assert alive(pids["lifeline"]) and alive(pids["child"])
    assert os.getpgid(pids["child"]) == pids["lifeline"]  # one session, led by the lifeline
    return owner, pids


def test_a_command_ends_when_its_owner_is_killed_and_not_before() -> None:
    owner, pids = start_owner(SLEEPER, grace_s=10.0)
    time.sleep(1.0)  # several polls with the owner alive: the command runs on
    assert alive(pids["child"]) and alive(pids["lifeline"])
    owner.kill()  # SIGKILL: no cleanup of its own
    owner.wait()
    took = wait_gone(pids["child"], timeout_s=5.0)
    wait_gone(pids["lifeline"], timeout_s=5.0)
    assert took < 2.0  # a poll or two, then SIGTERM, which the sleeper does not catch


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    owner, pids = start_owner(STUBBORN, grace_s=1.0)
    owner.kill()
    owner.wait()
    took = wait_gone(pids["child"], timeout_s=10.0)
    wait_gone(pids["lifeline"], timeout_s=5.0)
    assert took >= 1.0  # not before the grace


@pytest.mark.parametrize(
    ("script", "status"),
    [("raise SystemExit(3)", 3), ("import os; os.kill(os.getpid(), 9)", 128 + 9)],
)
def test_the_commands_exit_status_comes_back(script: str, status: int) -> None:
    cmd = lifeline.command(os.getpid(), [sys.executable, "-c", script])
    assert subprocess.run(cmd, start_new_session=True, timeout=30).returncode == status


def test_a_sigterm_to_the_session_waits_for_the_commands_own_shutdown(tmp_path: Path) -> None:
    """The lifeline ignores the group's SIGTERM and exits when the command has: a server's
    graceful stop (VllmServer.stop) is not cut short by its lifeline ending first."""
    done = tmp_path / "shut down"
    script = (
        "import os, signal, sys, time\n"
        "def bye(*_):\n"
        "    time.sleep(0.5)\n"
        f"    open({str(done)!r}, 'w').close()\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print(os.getpid(), flush=True)\n"
        "time.sleep(600)\n"
    )
    p = subprocess.Popen(
        lifeline.command(os.getpid(), [sys.executable, "-c", script]),
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    assert p.stdout is not None
    p.stdout.readline()
    os.killpg(p.pid, signal.SIGTERM)
    assert p.wait(timeout=30) == 0
    assert done.exists()  # the command finished its shutdown before the lifeline exited


def test_a_command_line_without_a_command_is_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-I", str(lifeline.PATH), str(os.getpid()), "--"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "no command" in result.stderr
