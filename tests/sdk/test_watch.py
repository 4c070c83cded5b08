"""`rlaas runs watch ID` as a user runs it: a real process, over the live stream.

Its exit code is the run's outcome (0 succeeded, 1 failed, 3 cancelled); a cut
connection is resumed where it broke. Piped (as here), it prints a line per step.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from sdk.client import Client
from tests.e2e.stack import REPO
from tests.web.live import LiveApi, live_api, migrated_database
from tests.web.proxy import cutting_proxy

SPEC = {"environment": {"name": "guess_number"}, "train": {"steps": 4}}


@pytest.fixture(scope="module")
def live(postgres_url: str) -> Iterator[LiveApi]:
    with live_api(migrated_database(postgres_url)) as running:
        yield running


def watch(url: str, key: str, run_id: str) -> subprocess.Popen[str]:
    env = {**os.environ, "RLAAS_API_URL": url, "RLAAS_API_KEY": key, "COLUMNS": "200"}
    return subprocess.Popen(
        [sys.executable, "-m", "sdk.cli", "runs", "watch", run_id],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_watch_follows_a_live_run_through_a_cut_and_exits_0(live: LiveApi) -> None:
    key = live.tenant()
    with Client(live.url, key) as client:
        run_id = client.create_run(SPEC).id
    worker = live.worker(run_id)
    worker.start()
    worker.step(1, {"reward/mean": 0.25, "loss": 2.0})
    with cutting_proxy(live.url) as proxy:
        proc = watch(proxy.url, key, run_id)
        try:
            _wait(lambda: any(b"/stream" in r for r in proxy.requests), "the watch to connect")
            time.sleep(0.5)
            proxy.cut()
            for step in (2, 3, 4):
                worker.step(step, {"reward/mean": 0.25 * step, "loss": 2.0 / step})
            worker.finish("succeeded")
            out, _ = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 0, out
    for step in (1, 2, 3, 4):
        assert out.count(f"step {step}/4 reward/mean") == 1, out  # each step once
    assert "resuming after step 1" in out
    assert "reward/mean: first 0.250, best 1.000, last 1.000" in out
    assert f"run {run_id} succeeded at step 4" in out


@pytest.mark.parametrize(("outcome", "code"), [("failed", 1), ("cancelled", 3)])
def test_watch_exits_with_the_runs_outcome(live: LiveApi, outcome: str, code: int) -> None:
    key = live.tenant()
    with Client(live.url, key) as client:
        run_id = client.create_run(SPEC).id
    worker = live.worker(run_id)
    worker.start()
    worker.step(1, {"reward/mean": 0.5})
    worker.finish(outcome, error="boom" if outcome == "failed" else None)
    proc = watch(live.url, key, run_id)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == code, out
    assert "step 1/4 reward/mean 0.5" in out and f"run {run_id} {outcome}" in out
    if outcome == "failed":
        assert "error: boom" in out


def test_watch_of_an_unknown_run_says_so(live: LiveApi) -> None:
    proc = watch(live.url, live.tenant(), "run_doesnotexist")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "not_found" in out, out


def _wait(check, what: str, timeout_s: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_the_summary_covers_the_whole_run_not_only_the_sparklines_window() -> None:
    from sdk.follow import HISTORY, RunWatch
    from sdk.models import MetricsStep, Run

    watch = RunWatch(Run.from_json({"id": "run_x", "status": "running"}))
    rewards = [0.01 * step for step in range(1, 3 * HISTORY + 1)]
    rewards[HISTORY // 2] = 5.0  # the best, long out of the sparklines' window
    for step, reward in enumerate(rewards, start=1):
        watch.apply(MetricsStep(step=step, metrics={"reward/mean": reward}))
    assert len(watch.history["reward/mean"]) == HISTORY
    assert watch.first["reward/mean"] == 0.01 and watch.best["reward/mean"] == 5.0
