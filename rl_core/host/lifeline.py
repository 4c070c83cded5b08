"""Run a command that must not outlive the process that started it.

    python lifeline.py OWNER_PID [--grace S] -- COMMAND [ARG ...]
    python lifeline.py OWNER_PID --reap [--grace S]

A worker stops the servers it started (a vLLM server: rl_core/rollout/vllm_server.py)
when it is done with them, but a worker killed with SIGKILL runs no cleanup, and a server
in a session of its own (so that it can be signalled as one group) would run on, holding
its memory and cores, with nobody left to send it a request. The lifeline sits between
them: started in the new session, it starts COMMAND there, and once OWNER_PID is no
longer its parent (the owner died and the lifeline was handed to init) it ends the
session: SIGTERM, then SIGKILL after ``--grace`` seconds.

While the owner lives it only waits: a signal sent to the session reaches COMMAND
itself, and the lifeline, which ignores SIGTERM, SIGINT and SIGHUP, exits once COMMAND
has, with its status (128 + the signal's number for a command a signal ended), so a
graceful stop stays graceful.

``--reap`` is for processes the owner does not start itself (Ray's: `ray.init` starts a
local cluster whose raylet starts agents of its own): the lifeline, started in a session
of its own, notes the owner's descendants every second and, once the owner is gone,
ends those of the last note that still run (the same pid and start time): Ray's own
processes share the fate of the process that started them, but its agents outlived a
SIGKILLed worker.

Stdlib only and run by its path, so it starts in milliseconds and imports nothing of
rlaas. Not ``prctl(PR_SET_PDEATHSIG)``: that fires when the *thread* that forked the
child ends, and a worker starts servers from threads that come and go.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

PATH = Path(__file__).resolve()
POLL_S = 0.25  # how often the owner is looked for: how late a dead owner's server ends
GRACE_S = 10.0  # from SIGTERM to SIGKILL once the owner is gone


def command(owner: int, argv: list[str], grace_s: float = GRACE_S) -> list[str]:
    """``argv`` wrapped in a lifeline held by process ``owner`` (usually ``os.getpid()``)."""
    # -I: the script's folder is not put on sys.path (its modules would shadow the stdlib's
    # only by name, but nothing of this package is wanted), nor PYTHON* variables read.
    return [sys.executable, "-I", str(PATH), str(owner), "--grace", str(grace_s), "--", *argv]


def reaper_command(owner: int, grace_s: float = GRACE_S) -> list[str]:
    """A reaper of ``owner``'s descendants, to be started in a session of its own."""
    return [sys.executable, "-I", str(PATH), str(owner), "--reap", "--grace", str(grace_s)]


def _ignore(signum: int, frame: FrameType | None) -> None:
    """A handler, not SIG_IGN: an ignored signal would stay ignored in COMMAND."""


def _end_session(child: subprocess.Popen[bytes], grace_s: float) -> int:
    os.killpg(os.getpgrp(), signal.SIGTERM)  # COMMAND and whatever it started
    deadline = time.monotonic() + grace_s
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if child.poll() is None:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # this process too: nothing is left to do
    return child.wait()


def _processes() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, start time in clock ticks)} of every process, from /proc."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:  # it ended since the listing
                continue
            found[int(entry.name)] = (int(fields[1]), int(fields[19]))
    return found


def _descendants(owner: int) -> dict[int, int]:
    """{pid: start time} of ``owner``'s descendants, this process left out."""
    processes = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in processes.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, list(children.get(owner, ()))
    while todo:
        pid = todo.pop()
        if pid != os.getpid():
            found[pid] = processes[pid][1]
            todo += children.get(pid, ())
    return found


def _still_running(noted: dict[int, int]) -> list[int]:
    now = _processes()
    return [pid for pid, start in noted.items() if pid in now and now[pid][1] == start]


def reap(owner: int, grace_s: float, poll_s: float = 1.0) -> int:
    """Note ``owner``'s descendants while it lives; once it is gone, end those noted."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _ignore)
    noted: dict[int, int] = {}
    while os.getppid() == owner:
        noted = _descendants(owner)
        time.sleep(poll_s)
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in _still_running(noted):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + wait_s
        while _still_running(noted) and time.monotonic() < deadline:
            time.sleep(0.1)
    return 0


def main(argv: list[str]) -> int:
    try:
        split = argv.index("--") if "--reap" not in argv else len(argv)
        owner, options, cmd = int(argv[0]), argv[1:split], argv[split + 1 :]
        grace_s = float(options[options.index("--grace") + 1]) if "--grace" in options else GRACE_S
    except (ValueError, IndexError):
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    if "--reap" in options:
        return reap(owner, grace_s)
    if not cmd:
        print("lifeline: no command after --", file=sys.stderr)
        return 2
    child = subprocess.Popen(cmd)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _ignore)
    while True:
        try:
            code = child.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != owner:
            code = _end_session(child, grace_s)
            break
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
