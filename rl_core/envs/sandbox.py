"""Run untrusted Python (what a model wrote) in a limited subprocess.

Each run gets a fresh temporary folder as its working directory (removed
afterwards), a clean environment (``PATH``, ``HOME``/``TMPDIR`` pointing at
that folder, nothing of the worker's: no tokens, no proxies), and
``python -I -S`` (no ``PYTHON*`` variables, no site-packages: the standard
library only). The limits:

- wall time: the parent kills the process group when ``wall_s`` passes;
- CPU time (``RLIMIT_CPU``), address space (``RLIMIT_AS``), file size
  (``RLIMIT_FSIZE``) and open files (``RLIMIT_NOFILE``), set in the child
  by ``_sandbox_guard.py`` before the model's code runs;
- output: each of stdout and stderr is read up to ``output_bytes``; past it
  the process is killed and the result marked ``truncated``;
- network: where unprivileged user namespaces work (``unshare -rn``), the
  child runs in a network namespace with no interfaces. Always, an audit
  hook refuses sockets, new processes, ctypes and file writes outside the
  folder (see the guard's docstring for what that does and does not stop).
  `SandboxResult.isolation` says which network wall was up.
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

GUARD = Path(__file__).with_name("_sandbox_guard.py")
KilledBy = Literal["wall_time", "cpu_time", "output", "signal"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxLimits:
    wall_s: float = 5.0
    cpu_s: int = 5
    memory_bytes: int = 512 * 2**20
    output_bytes: int = 16 * 2**10
    file_bytes: int = 8 * 2**20
    open_files: int = 64
    network: Literal["auto", "namespace", "audit"] = "auto"  # namespace: fail if unavailable

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
    isolation: Literal["namespace", "audit"]

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.killed_by is None


class SandboxUnavailable(RuntimeError):
    """``network="namespace"`` was asked for but user namespaces do not work here."""


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
    use_ns = limits.network != "audit" and namespaces_available()
    if limits.network == "namespace" and not use_ns:
        raise SandboxUnavailable("unshare -rn does not work here; use network='audit' or 'auto'")
    folder = Path(tempfile.mkdtemp(prefix="rlaas-sandbox-"))
    try:
        (folder / "main.py").write_text(code, encoding="utf-8")
        config = {
            "memory_bytes": limits.memory_bytes,
            "cpu_s": limits.cpu_s,
            "file_bytes": limits.file_bytes,
            "open_files": limits.open_files,
        }
        argv = [sys.executable, "-I", "-S", str(GUARD), json.dumps(config)]
        if use_ns:
            argv = ["unshare", "-rn", *argv]
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(folder),
            "TMPDIR": str(folder),
            "LANG": "C.UTF-8",
        }
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=folder,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group, killed as one
        )
        return await _collect(proc, checker, limits, "namespace" if use_ns else "audit")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def _collect(
    proc: asyncio.subprocess.Process,
    checker: str,
    limits: SandboxLimits,
    isolation: Literal["namespace", "audit"],
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
