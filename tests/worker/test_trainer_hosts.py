"""A run's trainer on two Ray actors (a real local Ray cluster, real processes): it trains,
and a trainer process SIGKILLed between calls fails the next call promptly with
`TrainerHostLost`, with every actor of the run gone afterwards."""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Iterator

import numpy as np
import pytest

from rl_core.pipeline.configs import trainer_config
from rl_core.pipeline.hosted import spec_trainer
from rl_core.spec import JobSpec, parse_spec
from rl_core.training.trainer import TrainBatch
from rl_core.training.trainer_group import TrainerGroup, TrainerHostLost
from worker.trainer_hosts import RayHosts, ensure_ray

CALL_TIMEOUT_S = 120  # the bound on a call whose peer is dead (a death is seen sooner)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    import ray

    ensure_ray(num_cpus=2)
    yield
    ray.shutdown()


def tiny_spec() -> JobSpec:
    return parse_spec(
        {
            "model": {"source": "builtin:tiny"},
            "environment": {"name": "guess_number"},
            "rollout": {"group_size": 2},
            "algorithm": {"batch_groups": 2},
            "resources": {"hosts": 2},
        }
    )


def a_batch(rows: int) -> TrainBatch:
    rng = np.random.default_rng(0)
    seqs = rng.integers(3, 100, size=(rows, 12)).tolist()
    mask = [[0] * 6 + [1] * 6] * rows
    zeros = [[0.0] * 12] * rows
    return TrainBatch.pack(seqs, mask, zeros, [1.0, -1.0] * (rows // 2), rows=rows)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_trainer_process_fails_the_call_and_stops_all(ray_cluster: None) -> None:
    spec = tiny_spec()
    hosts = RayHosts(
        2, functools.partial(spec_trainer, spec.model_dump_json()), call_timeout_s=CALL_TIMEOUT_S
    )
    group = TrainerGroup(hosts, trainer_config(spec))
    try:
        metrics = group.train_step(a_batch(spec.batch_size))
        assert metrics["optimizer_updates"] == 1.0 and np.isfinite(metrics["loss"])
        pids = hosts.pids()
        assert len(set(pids)) == 2 and os.getpid() not in pids
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(TrainerHostLost, match="died") as info:
            group.train_step(a_batch(spec.batch_size))
        assert info.value.retryable
        # ray.kill is asynchronous: the survivor's process goes within seconds.
        deadline = time.monotonic() + 30
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(p) for p in pids)
        with pytest.raises(TrainerHostLost, match="stopped"):
            group.params()
    finally:
        group.close()
