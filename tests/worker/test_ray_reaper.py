"""A worker SIGKILLed with a local Ray cluster running takes all of it along.

Ray's own processes (GCS, raylet, monitor) die with the process whose `ray.init` started
them, but the raylet's agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) outlived
it: `ensure_ray` starts a reaper (rl_core/host/lifeline.py, ``--reap``) that ends what
the worker left. Real Ray, a real SIGKILL."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from rl_core.host import lifeline

OWNER = textwrap.dedent(
    """
    import os, time
    import ray
    from worker.trainer_hosts import ensure_ray
    ensure_ray(num_cpus=1)
    @ray.remote
    class Actor:
        def pid(self):
            return os.getpid()
    actor = Actor.remote()
    print(ray.get(actor.pid.remote()), flush=True)
    time.sleep(600)
    """
)


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(300)
def test_a_killed_workers_ray_processes_all_end() -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        actor = int(owner.stdout.readline())
        deadline = time.monotonic() + 60
        while True:  # the raylet starts its agents on its own time
            started = psutil.Process(owner.pid).children(recursive=True)
            titles = {" ".join(p.cmdline()) for p in started if alive(p)}
            if any("Agent" in t for t in titles) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert any("ray::DashboardAgent" in t or "ray::RuntimeEnvAgent" in t for t in titles)
        assert actor in {p.pid for p in psutil.Process(owner.pid).children(recursive=True)}
        time.sleep(2.5)  # the reaper notes the tree once a second
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 30
    while (left := [p for p in started if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, [(p.pid, p.cmdline()) for p in left if alive(p)]
    assert any(str(lifeline.PATH) in t and "--reap" in t for t in titles), titles  # by it
