"""Run a command that must not outlive the process that started it.

    python lifeline.py OWNER_PID [--grace S] -- COMMAND [ARG ...]

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

Stdlib only and run by its path, so it starts in milliseconds and imports nothing of
rlaas. Not ``prctl(PR_SET_PDEATHSIG)``: that fires when the *thread* that forked the
child ends, and a worker starts servers from threads that come and go.
"""

from __future__ import annotations

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


def main(argv: list[str]) -> int:
    try:
        split = argv.index("--")
        owner, options, cmd = int(argv[0]), argv[1:split], argv[split + 1 :]
        grace_s = float(options[options.index("--grace") + 1]) if options else GRACE_S
    except (ValueError, IndexError):
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
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
