"""The sandbox's limits hold: each test runs a real child process that tries to break one."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from rl_core.envs.sandbox import (
    SandboxLimits,
    SandboxResult,
    bwrap_available,
    namespaces_available,
    run_python,
)

# The wall limit is generous so that on a loaded machine the limit under test fires first.
LIMITS = SandboxLimits(wall_s=30.0, cpu_s=1, memory_bytes=128 * 2**20, output_bytes=2000)


def run(code: str, limits: SandboxLimits = LIMITS, checker: str = "") -> SandboxResult:
    return asyncio.run(run_python(code, limits, checker=checker))


def test_runs_code_and_captures_both_streams() -> None:
    result = run("import sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert (result.ok, result.stdout, result.stderr, result.truncated) == (
        True,
        "out\n",
        "err\n",
        False,
    )


def test_infinite_loop_is_stopped_by_the_cpu_limit() -> None:
    result = run("while True:\n    pass")
    assert result.killed_by == "cpu_time" and not result.ok


def test_sleeping_forever_is_stopped_by_the_wall_limit() -> None:
    result = run("import time\ntime.sleep(60)", SandboxLimits(wall_s=0.5, cpu_s=5))
    assert result.killed_by == "wall_time" and result.exit_code is not None and result.exit_code < 0


@pytest.mark.parametrize(
    "code", ["x = bytearray(1 << 30)", "a = []\nwhile True: a.append(' ' * 10**6)"]
)
def test_memory_bomb_hits_the_address_space_limit(code: str) -> None:
    result = run(code)
    assert result.exit_code == 1 and "MemoryError" in result.stderr


def test_huge_output_is_truncated_and_the_process_killed() -> None:
    result = run("while True:\n    print('x' * 100)")
    assert result.truncated and result.killed_by == "output"
    assert len(result.stdout) == LIMITS.output_bytes


def test_socket_attempts_fail() -> None:
    with socket.socket() as listener:  # a real server on loopback it must not reach
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        result = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
    assert result.exit_code == 1 and "network access is disabled" in result.stderr


def test_network_namespace_when_available_else_audit_only() -> None:
    code = "import _socket\ns = _socket.socket()"  # the C module raises the same audit event
    result = run(code)
    assert "network access is disabled" in result.stderr
    strongest = "bwrap" if bwrap_available() else "namespace"
    assert result.isolation == (strongest if namespaces_available() else "audit")
    audit_only = run(code, SandboxLimits(network="audit"))
    assert audit_only.isolation == "audit" and "network access is disabled" in audit_only.stderr


def test_file_writes_outside_its_folder_are_refused(tmp_path: Path) -> None:
    target = tmp_path / "escape.txt"
    code = (
        f"import os\n"
        f"open('inside.txt', 'w').write('ok')\n"
        f"print(open('inside.txt').read())\n"
        f"for attempt in (lambda: open({str(target)!r}, 'w'),\n"
        f"                lambda: os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY),\n"
        f"                lambda: os.rename('inside.txt', {str(target)!r}),\n"
        f"                lambda: os.remove({str(tmp_path)!r})):\n"
        f"    try:\n"
        f"        attempt()\n"
        f"        print('escaped')\n"
        f"    except PermissionError:\n"
        f"        print('refused')\n"
        f"print(os.getcwd())\n"
    )
    result = run(code)
    lines = result.stdout.splitlines()
    assert lines[:5] == ["ok", "refused", "refused", "refused", "refused"], result.stderr
    assert not target.exists() and tmp_path.exists()
    assert not Path(lines[5]).exists()  # its own folder is removed afterwards


def test_processes_ctypes_and_the_worker_environment_are_out_of_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RLAAS_WORKER_TOKEN", "secret-token")
    monkeypatch.setenv("RLAAS_WORKER_CREDENTIAL", "rlaas_worker_0123456789ab_secret")
    code = (
        "import os\n"
        "print(sorted(os.environ))\n"
        "for attempt in (lambda: os.system('true'), lambda: __import__('ctypes'),\n"
        "                lambda: __import__('subprocess').run(['true']), lambda: os.kill(1, 0)):\n"
        "    try:\n"
        "        attempt()\n"
        "        print('escaped')\n"
        "    except PermissionError:\n"
        "        print('refused')\n"
    )
    lines = run(code).stdout.splitlines()
    assert lines == ["['HOME', 'LANG', 'PATH', 'TMPDIR']"] + ["refused"] * 4


def test_checker_runs_after_the_code_in_its_namespace_and_is_not_readable() -> None:
    code = (
        "import sys\n"
        "def f():\n"
        "    return 2\n"
        "print(repr(sys.stdin.read()) if not sys.stdin.closed else 'closed')"
    )
    result = run(code, checker="print('checked', f())")
    assert result.stdout.splitlines() == ["closed", "checked 2"]
