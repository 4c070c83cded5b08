"""Run untrusted Python (what a model wrote) in a limited subprocess.

Each run gets a fresh temporary folder as its working directory (removed
afterwards), a clean environment (``PATH``, ``HOME``/``TMPDIR`` pointing at
that folder, nothing of the worker's: no tokens, no proxies), and
``python -I -S`` (no ``PYTHON*`` variables, no site-packages: the standard
library only). The walls, strongest first; `SandboxResult.isolation` says which
stood:

- ``bwrap`` (Debian's ``bubblewrap``, where it runs): the child gets its own user,
  mount, pid, network, IPC and UTS namespaces, no capabilities, a new session, and
  a file system made of read-only ``/usr`` and the Python installation, its
  folder (a sized tmpfs at ``/sandbox``, the one place it can write) and fresh
  ``/proc`` and ``/dev`` (read-only, as is the root): nothing
  else of the host is there to read (no ``/etc``, no home, no data folder, no
  other process: ``/proc`` shows its own namespace only, so not the worker's
  environment). It dies with the worker, and the whole pid namespace dies with it
  when the wall limit kills it (a child that calls ``setsid`` does not outlive it).
  No network interface but loopback of its own.
- ``namespace`` (``unshare -rn``, where user namespaces work but bwrap is missing):
  only the network namespace.
- ``audit``: only the guard's audit hook (see ``_sandbox_guard.py``), which is
  not a boundary against a program that sets out to get past it.

Only the first is a wall between tenants: `rl_core.envs.walls` decides whether tenant
code may run behind a weaker one (a deployed worker refuses it unless its operator
opts out by name).

Inside every kind, the limits: wall time (the parent kills the process group when
``wall_s`` passes); CPU time (``RLIMIT_CPU``), address space (``RLIMIT_AS``), file
size (``RLIMIT_FSIZE``) and open files (``RLIMIT_NOFILE``), set by the guard
before the model's code runs; output: each of stdout and stderr is read up to
``output_bytes``, past it the process is killed and the result marked
``truncated``. The audit hook stays as a second line: it refuses sockets, new
processes, ctypes and file writes outside the folder.

Processes: ``RLIMIT_NPROC`` (set by the guard), and where the worker runs as root,
which that limit does not bind even inside a user namespace, a ``pids`` cgroup of the
run's own (`pids_cgroup`): a fork bomb stops at ``processes``.

Disk: each file is capped (``RLIMIT_FSIZE``); under bwrap the folder is a tmpfs of
``disk_bytes``, which bounds their total. The weaker walls bound each file only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from rl_core.envs.pids_cgroup import PidsCgroup

GUARD = Path(__file__).with_name("_sandbox_guard.py")
KilledBy = Literal["wall_time", "cpu_time", "output", "signal"]
Isolation = Literal["bwrap", "namespace", "audit"]
# Where the child sees its folder and the guard under bwrap (paths that exist in no
# host, so nothing the child prints about them means anything outside).
INSIDE_FOLDER, INSIDE_GUARD = "/sandbox", "/.rlaas-guard.py"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxLimits:
    wall_s: float = 5.0
    cpu_s: int = 5
    memory_bytes: int = 512 * 2**20
    output_bytes: int = 16 * 2**10
    file_bytes: int = 8 * 2**20
    open_files: int = 64
    # Processes (and threads) the program may have at once, itself included: RLIMIT_NPROC,
    # and for a worker running as root (which that limit does not bind) a pids cgroup.
    processes: int = 32
    # Bytes of all the files the program writes (under bwrap: its folder is a tmpfs of
    # this size; file_bytes caps each one).
    disk_bytes: int = 64 * 2**20
    # The strongest wall to use: "auto" is the strongest that runs here; the others
    # ask for that wall exactly (bwrap, namespace: SandboxUnavailable where it cannot).
    network: Literal["auto", "bwrap", "namespace", "audit"] = "auto"

    def __post_init__(self) -> None:
        if self.wall_s <= 0 or self.cpu_s < 1 or self.memory_bytes < 32 * 2**20:
            raise ValueError("wall_s > 0, cpu_s >= 1 and memory_bytes >= 32 MiB are required")


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # negative: killed by that signal
    killed_by: KilledBy | None
    truncated: bool
    isolation: Isolation

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.killed_by is None


class SandboxUnavailable(RuntimeError):
    """The wall asked for (``network="bwrap"`` or ``"namespace"``) does not work here."""


def bwrap_available() -> bool:
    """Does bubblewrap run here (installed, and user namespaces allowed)?"""
    return bwrap_problem() is None


@functools.cache
def bwrap_problem() -> str | None:
    """Why bubblewrap does not run here (None: it does), in words an operator can act on.

    Probed once per process (a real sandbox start); ``bwrap_problem.cache_clear()`` probes
    again."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (no `bwrap` on PATH)"
    try:
        with tempfile.TemporaryDirectory(prefix="rlaas-sandbox-probe-") as folder:
            Path(folder, "main.py").write_text("")
            done = subprocess.run(
                [*_bwrap(Path(folder), 2**20), _python(), "-I", "-S", "-c", "pass"],
                capture_output=True,
                timeout=10,
            )
    except subprocess.TimeoutExpired:
        return "bubblewrap did not start a sandbox within 10 s"
    except OSError as exc:
        return f"bubblewrap could not be started: {exc}"
    if done.returncode == 0:
        return None
    said = done.stderr.decode(errors="replace").strip().splitlines()
    # Its usual complaint here: user namespaces are not allowed to unprivileged processes.
    why = said[-1] if said else f"exit status {done.returncode}"
    return f"bubblewrap is installed but cannot build its sandbox ({why})"


@functools.cache
def namespaces_available() -> bool:
    """Can this machine give an unprivileged process its own empty network namespace?"""
    if shutil.which("unshare") is None:
        return False
    try:
        done = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


async def run_python(
    code: str, limits: SandboxLimits = SandboxLimits(), *, checker: str = ""
) -> SandboxResult:
    """Run ``code`` (then ``checker``, in the same namespace) under ``limits``."""
    isolation = _isolation(limits)
    folder = Path(tempfile.mkdtemp(prefix="rlaas-sandbox-"))
    cgroup: PidsCgroup | None = None
    try:
        (folder / "main.py").write_text(code, encoding="utf-8")
        config = json.dumps(
            {
                "memory_bytes": limits.memory_bytes,
                "cpu_s": limits.cpu_s,
                "file_bytes": limits.file_bytes,
                "open_files": limits.open_files,
                "processes": limits.processes,
            }
        )
        home = INSIDE_FOLDER if isolation == "bwrap" else str(folder)
        if isolation == "bwrap":
            argv = [*_bwrap(folder, limits.disk_bytes), _python(), "-I", "-S", INSIDE_GUARD, config]
        else:
            argv = [sys.executable, "-I", "-S", str(GUARD), config]
            if isolation == "namespace":
                argv = ["unshare", "-rn", *argv]
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
        # bwrap keeps two processes of its own (itself and the namespace's init).
        cgroup = PidsCgroup.create(limits.processes + (2 if isolation == "bwrap" else 0))
        if cgroup is not None:
            argv = cgroup.wrap(argv)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=folder,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group, killed as one
        )
        return await _collect(proc, checker, limits, isolation)
    finally:
        if cgroup is not None:
            cgroup.remove()
        shutil.rmtree(folder, ignore_errors=True)


def _isolation(limits: SandboxLimits) -> Isolation:
    wanted = limits.network
    if wanted in ("auto", "bwrap") and bwrap_available():
        return "bwrap"
    if wanted == "bwrap":
        raise SandboxUnavailable(f"bwrap does not run here: {bwrap_problem()}")
    if wanted in ("auto", "namespace") and namespaces_available():
        return "namespace"
    if wanted == "namespace":
        raise SandboxUnavailable("unshare -rn does not work here; use network='audit' or 'auto'")
    return "audit"


def _python() -> str:
    # The interpreter itself, not a virtualenv's link to it: the venv is not mounted.
    return os.path.realpath(sys.executable)


def _bwrap(folder: Path, disk_bytes: int) -> list[str]:
    """bubblewrap's arguments: every namespace new, the host's files as listed only.

    The program's folder is a tmpfs of ``disk_bytes`` (a write past it fails with ENOSPC),
    holding its ``main.py`` read-only; what it writes there is gone with the sandbox."""
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    argv += ["--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/lib", "/lib64", "/sbin"):
        if os.path.islink(top):  # merged /usr: a link into it
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    prefix = os.path.realpath(sys.base_prefix)
    if not prefix.startswith("/usr/"):
        argv += ["--ro-bind", prefix, prefix]  # a Python installed elsewhere (pyenv, /opt)
    argv += ["--ro-bind", str(GUARD), INSIDE_GUARD]
    argv += ["--size", str(disk_bytes), "--tmpfs", INSIDE_FOLDER]
    argv += ["--ro-bind", str(folder / "main.py"), f"{INSIDE_FOLDER}/main.py"]
    argv += ["--chdir", INSIDE_FOLDER, "--proc", "/proc", "--dev", "/dev"]
    # bwrap's root and its /dev are tmpfs the program could fill file by file: read-only
    # once everything is mounted, so the sized folder is the only place it writes.
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    return [*argv, "--"]


async def _collect(
    proc: asyncio.subprocess.Process,
    checker: str,
    limits: SandboxLimits,
    isolation: Isolation,
) -> SandboxResult:
    assert proc.stdin and proc.stdout and proc.stderr
    over = asyncio.Event()

    async def read(stream: asyncio.StreamReader) -> tuple[bytes, bool]:
        data = bytearray()
        while chunk := await stream.read(65536):
            room = limits.output_bytes - len(data)
            data += chunk[: max(room, 0)]
            if len(chunk) > room:
                over.set()
                return bytes(data), True
        return bytes(data), False

    killed_by: KilledBy | None = None
    try:
        proc.stdin.write(checker.encode())
        await proc.stdin.drain()
        proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # it died before reading: the exit code says why
    readers = asyncio.gather(read(proc.stdout), read(proc.stderr))
    overflow = asyncio.ensure_future(over.wait())
    try:
        waiting: set[asyncio.Future[Any]] = {readers, overflow}
        done, _ = await asyncio.wait(waiting, timeout=limits.wall_s, return_when="FIRST_COMPLETED")
        if readers not in done:
            killed_by = "output" if overflow in done else "wall_time"
            _kill(proc)
        (out, out_cut), (err, err_cut) = await readers
        try:
            async with asyncio.timeout(5):
                await proc.wait()
        except TimeoutError:
            _kill(proc)
            await proc.wait()
    finally:
        overflow.cancel()
        if proc.returncode is None:
            _kill(proc)
    code = proc.returncode
    if isolation == "bwrap" and code is not None and code > 128:
        code = 128 - code  # bwrap's init reports a child killed by signal N as 128 + N
    if killed_by is None and code in (-signal.SIGXCPU, -signal.SIGKILL):
        killed_by = "cpu_time" if code == -signal.SIGXCPU else "signal"
    return SandboxResult(
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        exit_code=code,
        killed_by=killed_by,
        truncated=out_cut or err_cut,
        isolation=isolation,
    )


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):  # it is already gone
        os.killpg(proc.pid, signal.SIGKILL)
