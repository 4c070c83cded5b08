"""Helpers for runs of the real pipeline (tiny model, `rl_core.pipeline.runner.train`)
against environment servers that struggle; the servers themselves are in this folder."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from rl_core.envs.webhook import WebhookTarget
from rl_core.protocol.addresses import Allowlist
from rl_core.spec import JobSpec, parse_spec
from tests.conftest import REPO

SECRET = "faults-secret-0123456789"
LOOPBACK = Allowlist.parse("loopback", embedded=False)


def tiny_spec(env_id: str, **patch: Any) -> JobSpec:
    """A short run of the tiny model on a one-step game served at ``env_id``."""
    data: dict[str, Any] = {
        "environment": {"name": env_id},
        "agent": {"max_turns": 2, "max_new_tokens": 4, "max_context": 256},
        "rollout": {"group_size": 8, "concurrency": 128},
        "algorithm": {"batch_groups": 16, "learning_rate": 1e-3},
        "staleness": {"mode": "async", "max_staleness": 1},
        "train": {"steps": 2, "seed": 0},
    }
    for section, values in patch.items():
        data[section] = {**data.get(section, {}), **values}
    return parse_spec(data)


def target(env_id: str, url: str, *, concurrency: int, timeout_s: float) -> WebhookTarget:
    return WebhookTarget(
        id=env_id,
        url=url,
        secret=SECRET,
        timeout_s=timeout_s,
        max_concurrency=concurrency,
        allowlist=LOOPBACK,
    )


@contextlib.contextmanager
def naive_server(stats: dict[str, Any]) -> Iterator[str]:
    """`tests.faults.naive_server` in its own process; yields its URL, and fills ``stats``
    with what it counted (requests by route, steps applied) once it has stopped."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.naive_server", SECRET],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        _, err = proc.communicate(input="", timeout=30)
        lines = err.strip().splitlines()
        stats.update(json.loads(lines[-1]) if lines else {})
