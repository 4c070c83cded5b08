"""A cap on the number of processes of one sandboxed program, kernel-enforced.

``RLIMIT_NPROC`` (which the sandbox's guard also sets) counts a user's processes, and
the kernel does not apply it to root: a worker running as root (CI, some hosts) would
let a fork bomb through, even inside bubblewrap's user namespace, whose user maps back
to root. The ``pids`` cgroup controller has no such exception: the program and every
process it starts are counted in a cgroup of their own, and a fork past ``pids.max``
fails with EAGAIN.

Made only where the worker may: as root, with the ``pids`` controller writable (cgroup
v1's ``/sys/fs/cgroup/pids``, or v2's unified tree where the controller is enabled for
children). Elsewhere `create` answers None and the rlimit is the bound, which holds for
any user but root. The command joins its cgroup before it starts (`PidsCgroup.wrap`),
so nothing it starts is outside it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

V1 = Path("/sys/fs/cgroup/pids")
V2 = Path("/sys/fs/cgroup")


class PidsCgroup:
    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, max_pids: int) -> PidsCgroup | None:
        """A fresh cgroup capped at ``max_pids`` processes, or None where none can be made."""
        parent = _parent()
        if parent is None:
            return None
        path = parent / f"rlaas-sandbox-{secrets.token_hex(6)}"
        try:
            path.mkdir()
            (path / "pids.max").write_text(str(max_pids))
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return cls(path)

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` started inside this cgroup: a shell moves itself in ("0" is the process
        that writes), then becomes the command. Not a ``preexec_fn``: Python code between
        fork and exec is unsafe in a process with threads, as a worker is."""
        join = f'echo 0 > "{self.path}/cgroup.procs" && exec "$@"'
        return ["/bin/sh", "-c", join, "sh", *argv]

    def remove(self) -> None:
        """Delete the cgroup once its processes are gone (retried briefly: a killed process
        group leaves it a moment after the kill)."""
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                _kill_all(self.path)
                os.sched_yield()
        # Left behind: empty cgroups cost nothing, and the name is never reused.


def _parent() -> Path | None:
    if os.geteuid() != 0:
        return None  # RLIMIT_NPROC binds every other user
    if (V1 / "pids.max").exists() or (V1 / "cgroup.procs").exists():
        return V1 if os.access(V1, os.W_OK) else None
    controllers = V2 / "cgroup.subtree_control"
    try:
        if "pids" in controllers.read_text().split() and os.access(V2, os.W_OK):
            return V2
    except OSError:
        return None
    return None


def _kill_all(path: Path) -> None:
    with contextlib.suppress(OSError):
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), 9)
