"""The protocol page, proved by a stranger's server: node_env/server.js was written from
docs/environment-protocol.md alone (its HMAC check is the page's, plain node:http, no npm
packages), and the tiny model trains against it through the worker's own entry point
(`rl_core.pipeline.runner.train`, as worker/job.py calls it, with the run's episode
prefix). Node is required: a machine without it fails here, loudly (scripts/bootstrap.sh
installs Debian's nodejs)."""

from __future__ import annotations

import collections
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rl_core.envs.webhook import WebhookTarget
from rl_core.host.sinks import MemorySink
from rl_core.pipeline.runner import train
from rl_core.protocol.addresses import Allowlist
from rl_core.spec import parse_spec

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(1)]

SERVER = Path(__file__).parent / "node_env" / "server.js"
SECRET = "node-env-secret-0123456789"
RUN_ID = "run_5d41402abc4b2a76b9719d911017c592"
ENV_ID = "env_0c9a4e5b2f7d4c1e8a6b3d2f1e0c9b8a"


def node() -> str:
    found = shutil.which("node")
    assert found, "node is not installed: run scripts/bootstrap.sh (Debian's nodejs)"
    return found


class NodeServer:
    """The Node server in its own process; `stop` ends it and returns what it saw."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [node(), str(SERVER), SECRET],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        port = self.proc.stdout.readline().strip()
        assert port.isdigit(), self.proc.stderr.read() if self.proc.stderr else port
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> dict[str, Any]:
        if self.proc.poll() is None:
            self.proc.terminate()
        out, err = self.proc.communicate(timeout=20)
        lines = out.strip().splitlines()
        assert lines, err
        return dict(json.loads(lines[-1]))


@pytest.fixture
def node_server() -> Iterator[NodeServer]:
    server = NodeServer()
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.communicate(timeout=20)


def test_the_tiny_model_trains_against_a_node_server_written_from_the_page(
    node_server: NodeServer,
) -> None:
    url = node_server.url
    # Its signature check is real: unsigned and wrongly signed requests are refused.
    assert httpx.post(f"{url}/reset", json={"episode_id": "x", "seed": 1}).status_code == 401
    spec = parse_spec(
        {
            "environment": {"name": ENV_ID, "config": {"max_value": 4}},
            "agent": {"max_turns": 1, "max_new_tokens": 8, "max_context": 96},
            "rollout": {"group_size": 4, "concurrency": 16},
            "algorithm": {"batch_groups": 2, "learning_rate": 1e-3},
            "train": {"steps": 2, "seed": 0},
        }
    )
    target = WebhookTarget(
        id=ENV_ID,
        url=url,
        secret=SECRET,
        timeout_s=10.0,
        max_concurrency=16,
        allowlist=Allowlist.parse("loopback", embedded=False),
    )
    sink = MemorySink()
    result = train(spec, sink=sink, episode_prefix=f"{RUN_ID}~a1-", webhooks={ENV_ID: target})
    seen = node_server.stop()

    assert result.steps_completed == 2
    metrics = [m for _, m in sink.steps]
    assert [m["episode/trained"] for m in metrics] == [8.0] * 2
    assert sum(m["failures/total"] for m in metrics) == 0, metrics
    assert all(m["env/faults/status_refused"] == 0 for m in metrics)
    # The episodes played the game: the model's answers reached /step and were scored.
    assert seen["steps"], "no episode ever took a step"
    assert seen["badSteps"] == 0 and seen["refused"] == 1  # only the unsigned probe above
    # Every reset got its close; ids are the page's format; a group shares its seed.
    assert seen["resets"] and set(seen["closes"]) >= set(seen["resets"])
    assert all(e.startswith(f"{RUN_ID}~a1-g") for e in seen["resets"])
    by_group = collections.defaultdict(set)
    for episode, seed in seen["seeds"].items():
        by_group[episode.rsplit("-e", 1)[0]].add(seed)
    assert all(len(seeds) == 1 for seeds in by_group.values()), by_group
    assert all(0 <= s < 2**31 for s in seen["seeds"].values())
