"""A whole run with ``resources.hosts: 2`` (two spawned trainer processes, jax.distributed
over gloo) against the same run on one process, and its checkpoint resumed on one.

Sync mode is deterministic on the tiny model (tests/rl_core/pipeline/test_runner.py
resumes to the same metrics), so the two runs sample the same episodes as long as the
engine's weights agree to float32 rounding: the K=2 trainer's weights differ from one
process's only by the order of the gradient sum's reduction (tests/rl_core/training/
test_spmd.py says why 2e-5 bounds it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rl_core.host.sinks import MemorySink
from rl_core.pipeline.runner import start_local_hosts, train
from rl_core.spec import JobSpec
from rl_core.training.checkpointing import checkpoint_dir
from tests.rl_core.pipeline.test_runner import small_spec

WEIGHT_TOL = 2e-5


def spec(hosts: int) -> JobSpec:
    return small_spec(train={"steps": 3, "checkpoint_interval": 1}, resources={"hosts": hosts})


def arrays(checkpoint: Path) -> dict[str, np.ndarray]:
    import orbax.checkpoint as ocp

    with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as ckptr:
        restored = ckptr.restore(checkpoint / "state")
    return {name: np.asarray(value) for name, value in restored.items()}


def test_two_trainer_processes_train_the_run_one_does_and_resume_on_one(
    tmp_path: Path,
) -> None:
    one, two = MemorySink(), MemorySink()
    train(spec(1), sink=one, artifacts_dir=tmp_path / "one")
    done = train(spec(2), sink=two, artifacts_dir=tmp_path / "two", trainer_hosts=start_local_hosts)
    assert done.steps_completed == 3 and [s for s, _ in two.steps] == [1, 2, 3]
    for (_, want), (_, got) in zip(one.steps, two.steps, strict=True):
        for name in ("reward/mean", "episode/length_mean"):
            assert got[name] == want[name], name  # the same episodes were sampled
        for name in ("loss", "grad_norm", "entropy"):
            assert got[name] == pytest.approx(want[name], rel=1e-4, abs=1e-6), name
    # Written once (by the pipeline's process, from process 0's copy), whole arrays.
    want_state = arrays(checkpoint_dir(tmp_path / "one", 3))
    got_state = arrays(checkpoint_dir(tmp_path / "two", 3))
    assert want_state.keys() == got_state.keys()
    for name, value in want_state.items():
        np.testing.assert_allclose(got_state[name], value, atol=WEIGHT_TOL, rtol=0, err_msg=name)

    # The two-process run's step-2 checkpoint resumes on one process: step 3 as before.
    rest = MemorySink()
    resumed = train(
        spec(1),
        sink=rest,
        artifacts_dir=tmp_path / "two",
        resume_from=str(checkpoint_dir(tmp_path / "two", 2)),
    )
    assert resumed.steps_completed == 1 and [s for s, _ in rest.steps] == [3]
    for name in ("reward/mean", "loss", "grad_norm"):
        assert rest.steps[0][1][name] == pytest.approx(one.steps[2][1][name], rel=1e-4), name
