"""Attacks on the ``code_exec`` sandbox by a program that knows its source.

Each attack first gets past the guard's audit hook as a hostile program can (the hook
reads its allow-lists from the guard module's globals, which the program reaches as
``sys.modules['__main__']``), then tries one thing. Each runs twice: with the walls of
before (``network="audit"``: the hook alone, where the attack succeeds, which shows the
attack is real) and with bubblewrap (``network="bwrap"``: it must fail). The bwrap half
is skipped nowhere: on a machine without bubblewrap the sandbox raises
`SandboxUnavailable` and the test fails (CI installs it: scripts/bootstrap.sh).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from rl_core.envs.pids_cgroup import PidsCgroup
from rl_core.envs.sandbox import SandboxLimits, SandboxResult, run_python

# What a program that has read _sandbox_guard.py writes first.
BYPASS = (
    "import sys\n"
    "guard = sys.modules['__main__']\n"
    "guard._NETWORK, guard._PROCESSES, guard._PATH_EVENTS = (), (), {}\n"
)
WALLS = ["audit", "bwrap"]


def attack(code: str, wall: str, **limits: float) -> SandboxResult:
    settings = SandboxLimits(
        wall_s=limits.get("wall_s", 20.0), cpu_s=5, memory_bytes=256 * 2**20, network=wall
    )  # type: ignore[arg-type]
    return asyncio.run(run_python(BYPASS + code, settings))


@pytest.mark.parametrize("wall", WALLS)
def test_the_workers_environment_cannot_be_read_from_proc(wall: str) -> None:
    # A process holding a secret in its environment, as the worker holds its token.
    worker = subprocess.Popen(
        ["sleep", "60"], env={"PATH": "/usr/bin:/bin", "RLAAS_WORKER_TOKEN": "canary-5f2a"}
    )
    code = (
        "import os\n"
        "found = []\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n"
        "        if b'canary-5f2a' in open(f'/proc/{pid}/environ', 'rb').read():\n"
        "            found.append(pid)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('found' if found else 'nothing')\n"
    )
    try:
        result = attack(code, wall)
    finally:
        worker.kill()
        worker.wait()
    assert result.stdout.strip() == ("found" if wall == "audit" else "nothing"), result.stderr


@pytest.mark.parametrize("wall", WALLS)
def test_another_runs_files_cannot_be_read(wall: str, tmp_path: Path) -> None:
    checkpoint = tmp_path / "runs" / "run_other" / "checkpoint.bin"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"another tenant's weights")
    code = (
        f"try:\n    print(open({str(checkpoint)!r}, 'rb').read().decode())\n"
        "except OSError as exc:\n    print('refused', type(exc).__name__)\n"
    )
    result = attack(code, wall)
    if wall == "audit":
        assert result.stdout.strip() == "another tenant's weights"
    else:
        assert result.stdout.startswith("refused"), result.stdout
    # Nor anything else of the host: no /etc, no home, no data folder.
    listing = attack("import os\nprint(sorted(os.listdir('/')))", wall)
    if wall == "bwrap":
        assert "etc" not in listing.stdout and "tmp" not in listing.stdout
        assert "work" not in listing.stdout and "home" not in listing.stdout


@pytest.mark.parametrize("wall", WALLS)
def test_no_socket_reaches_the_hosts_loopback(wall: str) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('connected')\n"
            "except OSError as exc:\n    print('refused', exc)\n"
        )
        result = attack(code, wall)
    assert result.stdout.startswith("connected" if wall == "audit" else "refused"), result.stdout


@pytest.mark.parametrize("wall", WALLS)
def test_a_child_that_calls_setsid_does_not_outlive_the_limit(wall: str) -> None:
    marker = f"time.sleep(30.{os.getpid()}{len(wall)})"  # unique to this test's child
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; {marker}'], "
        "start_new_session=True, stdout=open('log', 'w'), stderr=subprocess.STDOUT)\n"
        "print('spawned', flush=True)\n"
        "time.sleep(60)\n"
    )
    result = attack(code, wall, wall_s=2.0)
    assert result.killed_by == "wall_time" and "spawned" in result.stdout, result.stderr
    time.sleep(0.5)  # a dying namespace takes its processes with it, not always at once
    survivors = _processes_running(marker)
    for pid in survivors:
        os.kill(pid, 9)  # the audit-only wall's escapee: clean up after showing it
    # Under the hook alone the child escapes, unless the run had a pids cgroup (a worker
    # running as root): setsid leaves the process group, never the cgroup, whose
    # processes are killed when the run ends.
    assert bool(survivors) == (wall == "audit" and not pids_cgroup_here())


@pytest.mark.parametrize("wall", WALLS)
def test_a_fork_bomb_stops_at_the_process_limit(wall: str) -> None:
    # Bounded by the attack itself (300 sleeping children), so a failing wall shows the
    # attack without taking the machine down.
    code = (
        "import os, time\n"
        "made = 0\n"
        "for _ in range(300):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(5)\n"
        "        os._exit(0)\n"
        "    made += 1\n"
        "print('made', made, flush=True)\n"
    )
    result = attack(code, wall, wall_s=10.0)
    made = int(result.stdout.split()[-1]) if result.stdout.startswith("made") else -1
    assert 0 <= made < SandboxLimits().processes, (made, result.stderr[-500:])


@pytest.mark.parametrize("wall", WALLS)
def test_many_files_stop_at_the_disk_limit(wall: str) -> None:
    # Each file under the file-size cap (8 MiB), 160 MiB in all: bounded by the attack
    # itself, so a failing wall shows it without filling the machine's disk.
    code = (
        "written = 0\n"
        "try:\n"
        "    for i in range(40):\n"
        "        with open(f'f{i}', 'wb') as f:\n"
        "            f.write(b'x' * 4 * 2**20)\n"
        "        written += 4\n"
        "except OSError:\n"
        "    pass\n"
        "print('wrote', written, flush=True)\n"
    )
    result = attack(code, wall)
    written = int(result.stdout.split()[-1]) if result.stdout.startswith("wrote") else -1
    # The hook alone bounds each file, not their total: the attack is real there.
    limit = SandboxLimits().disk_bytes // 2**20 if wall == "bwrap" else 160
    assert 0 <= written <= limit, (written, result.stderr[-500:])
    if wall == "bwrap":
        assert written < 160


def test_nothing_outside_its_folder_is_writable_under_bubblewrap() -> None:
    # The hook's write check switched off: only the mounts stand. Anywhere but the sized
    # folder would be memory no limit bounds (each file is capped, not their number).
    code = (
        "import os, sys\n"
        "sys.modules['__main__']._WRITE_FLAGS = 0\n"
        "for target in ('/x', '/dev/x', '/dev/shm/x', '/usr/x', '/proc/x'):\n"
        "    try:\n"
        "        os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))\n"
        "        print('wrote', target, flush=True)\n"
        "    except OSError:\n"
        "        pass\n"
    )
    result = attack(code, "bwrap")
    assert result.ok, result.stderr[-500:]
    assert "wrote" not in result.stdout, result.stdout


@pytest.mark.parametrize("wall", WALLS)
def test_a_10_gb_file_stops_at_the_file_size_limit(wall: str) -> None:
    code = (
        "with open('big', 'wb') as f:\n"
        "    for _ in range(10 * 1024):\n"
        "        f.write(b'x' * 2**20)\n"
    )
    result = attack(code, wall)
    assert not result.ok and result.exit_code is not None and result.exit_code != 0


def pids_cgroup_here() -> bool:
    cgroup = PidsCgroup.create(8)
    if cgroup is not None:
        cgroup.remove()
    return cgroup is not None


def _processes_running(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and int(pid) != os.getpid():
            found.append(int(pid))
    return found


# A program that reads the checker's source from the guard's frame (where its random
# marker is), prints the checker's line claiming every case, and exits before the
# checker runs. Against the checker of before (it compared inside the sandbox and
# printed a score) this earned 1.0 for a program that defines nothing; now the sandbox
# only reports what the function returned and the worker compares.
FORGED = """```python
import sys, os, re, json
source = sys._getframe(1).f_locals.get("checker", "")
marker = re.search(r"'(__rlaas_[0-9a-f]+__)'", source).group(1)
print(marker + json.dumps({"passed": 3, "total": 3}), flush=True)
print(marker + json.dumps([["int", "-7"]] * 3), flush=True)  # no case is -7
os._exit(0)
```"""
ALWAYS_EQUAL = """```python
class Anything(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def gcd(a, b):
    return Anything(0)
```"""


@pytest.mark.parametrize("program", [FORGED, ALWAYS_EQUAL], ids=["forged-line", "always-equal"])
def test_a_program_cannot_score_itself(program: str) -> None:
    from rl_core.envs import Action
    from rl_core.envs.code_exec import CodeExec

    async def main() -> float:
        env = CodeExec()
        await env.reset("e", 0, {"tasks": ["gcd"]})
        return (await env.step("e", 1, Action(content=program))).reward

    assert asyncio.run(main()) == 0.0


@pytest.mark.parametrize(
    ("field", "value"),
    [("wall_s", 3600), ("cpu_s", 10**6), ("memory_mb", 10**6), ("output_bytes", 10**9),
     ("max_turns", 10**4), ("wall_s", 0)],
)  # fmt: skip
def test_a_spec_cannot_raise_the_sandboxs_limits_past_their_caps(field: str, value: int) -> None:
    from rl_core.envs.code_exec import CodeExec
    from rl_core.errors import EnvironmentFailure

    with pytest.raises(EnvironmentFailure, match=f"{field} must be from"):
        asyncio.run(CodeExec().reset("e", 0, {field: value}))
