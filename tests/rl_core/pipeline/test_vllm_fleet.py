"""`runner.train` with ``resources.rollout_servers: 2``: rlaas starts two vLLM CPU servers
for the run (`rl_core.rollout.fleet`), spreads the episodes over both, pushes every update
to both (each checked by its probe), and when one is SIGKILLed mid-run the other serves
its requests while it is restarted, re-synced to the newest weights and put back.

Sync mode on ``builtin:small`` (see test_vllm_run.py): the trainer's recomputed logprobs
must equal the servers' at every step, before the kill and after the restart, so a
server left on old weights shows as ``mismatch_kl`` far from 0.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Mapping
from pathlib import Path

import psutil
import pytest

from rl_core.host.control import RunControl
from rl_core.host.sinks import MemorySink
from rl_core.pipeline.runner import train
from rl_core.spec import parse_spec
from tests.rl_core.rollout.vllm_venv import ensure_vllm_venv


def vllm_servers() -> list[psutil.Process]:
    """This process's vLLM servers (the heads of their process groups), oldest first."""
    heads = [
        p
        for p in psutil.Process().children(recursive=True)
        if "vllm.entrypoints.openai.api_server" in " ".join(p.cmdline())
        and os.getpgid(p.pid) == p.pid
    ]
    return sorted(heads, key=lambda p: p.create_time())


class KillOnce(MemorySink):
    """After step 1, SIGKILLs the first server's process group; stops the run once the
    fleet reports it back and serving (or at the spec's last step)."""

    def __init__(self, control: RunControl) -> None:
        super().__init__()
        self.control = control
        self.killed: int | None = None
        self.back_at: int | None = None

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        super().on_step(step, metrics)
        if step == 1:
            (first, _) = vllm_servers()
            self.killed = first.pid
            threading.Thread(target=os.killpg, args=(first.pid, signal.SIGKILL)).start()
        elif (
            self.killed is not None
            and self.back_at is None
            and metrics.get("fleet/servers_up") == 2.0
            and metrics.get("fleet/recoveries", 0) >= 1
            and metrics.get("fleet/server_0/requests", 0) > 0
        ):
            self.back_at = step
            self.control.request_stop()


@pytest.mark.minutes(5)
def test_a_fleet_of_two_servers_trains_through_a_killed_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ensure_vllm_venv()
    caplog.set_level(logging.WARNING, logger="rl_core.rollout.fleet")
    spec = parse_spec(
        {
            "model": {"source": "builtin:small"},
            "environment": {
                "name": "guess_number",
                "config": {"low": 1, "high": 4, "max_turns": 2},
            },
            "agent": {"max_turns": 2, "max_new_tokens": 8, "max_context": 64},
            "rollout": {"engine": "vllm", "group_size": 4, "concurrency": 8},
            "algorithm": {"batch_groups": 2, "learning_rate": 3e-2, "entropy_coef": 1.0},
            "staleness": {"mode": "sync"},
            "resources": {"rollout_servers": 2},
            # Long enough for the killed server to come back (about a minute here); the
            # sink stops the run once it has served again.
            "train": {"steps": 400, "seed": 0, "checkpoint_interval": 0},
        }
    )
    control = RunControl()
    sink = KillOnce(control)
    result = train(spec, sink=sink, control=control, artifacts_dir=tmp_path / "run")
    assert sink.killed is not None
    assert sink.back_at is not None, "the killed server never served again"
    # Nothing lost: every step trained on its whole batch, and the servers sampled with
    # the trainer's weights throughout (each update was checked by both probes).
    assert result.steps_completed == sink.back_at
    for step, m in sink.steps:
        assert m["mismatch_kl"] < 1e-3, (step, m["mismatch_kl"])
        served = m.get("fleet/server_0/requests", 0) + m.get("fleet/server_1/requests", 0)
        assert served >= 2 * 4, step  # each episode's turns (1 or 2) were served by someone
    first = dict(sink.steps)[1]
    assert first["fleet/server_0/requests"] > 0 and first["fleet/server_1/requests"] > 0
    logs = [tmp_path / "run" / f"vllm-server-{i}.log" for i in (0, 1)]
    assert all("Reloading weights inplace" in log.read_text() for log in logs)
    # Its failure is told by the server's name in the run, not the port it had here.
    downs = [r.getMessage() for r in caplog.records if " is down (" in r.getMessage()]
    assert downs, "the fleet never told the server's death"
    for down in downs:
        assert "is down (rollout server 0 of 2 " in down and "127.0.0.1" not in down, down
    print(
        f"killed after step 1, back and serving at step {sink.back_at}; "
        f"resent {sink.steps[-1][1]['fleet/resent']:.0f} requests"
    )
