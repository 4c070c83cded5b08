"""Resuming from the artifact store on a disk that never saw the run: a real S3 server
(moto's, on loopback), the tiny model; the resumed trainer and run continue bit-for-bit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rl_core.host.control import RunControl
from rl_core.host.sinks import MemorySink
from rl_core.models import ModelConfig
from rl_core.pipeline.runner import train
from rl_core.store import open_store
from rl_core.training.checkpointing import checkpoint_dir, restore_checkpoint, save_checkpoint
from rl_core.training.stored import RunArtifacts, StoreTarget, stored_steps
from tests.rl_core.pipeline.test_runner import StopAfter, small_spec
from tests.rl_core.training.test_checkpointing import assert_same_state, batch, fresh


def test_a_trainer_resumes_from_the_store_bit_for_bit(
    tmp_path: Path, tiny_config: ModelConfig, s3_store_url: str
) -> None:
    store = open_store(s3_store_url, endpoint=os.environ["RLAAS_S3_ENDPOINT"])
    straight = fresh(tiny_config)
    straight_metrics = [straight.train_step(batch(s)) for s in range(4)]

    first = fresh(tiny_config)
    for s in range(2):
        first.train_step(batch(s))
    host_a = RunArtifacts(tmp_path / "host-a", StoreTarget(store, "run-x"), keep=3)
    local = save_checkpoint(
        checkpoint_dir(host_a.run_dir, 2), step=2, trainer=first, extra={"collector": {"next": 5}}
    )
    record = host_a.after_save(local, 2)
    assert record.uri.startswith("s3://") and stored_steps(store, "run-x") == [2]

    host_b = RunArtifacts(tmp_path / "host-b", StoreTarget(store, "run-x"), keep=3)
    assert not host_b.run_dir.exists()  # an empty disk: the store is all it has
    resumed = fresh(tiny_config)
    step, extra = restore_checkpoint(host_b.resolve(record.uri), trainer=resumed)
    assert (step, extra) == (2, {"collector": {"next": 5}})
    resumed_metrics = [resumed.train_step(batch(s)) for s in range(2, 4)]
    assert_same_state(straight, resumed)
    assert resumed_metrics == straight_metrics[2:]


def test_a_stopped_run_resumes_from_the_store_on_an_empty_disk(
    tmp_path: Path, s3_store_url: str
) -> None:
    store = open_store(s3_store_url, endpoint=os.environ["RLAAS_S3_ENDPOINT"])
    target = StoreTarget(store, "run-y")
    spec = small_spec(train={"steps": 3, "checkpoint_interval": 1, "keep_checkpoints": 1})
    whole = MemorySink()
    train(spec, sink=whole)

    control = RunControl()
    first = StopAfter(control, 2)
    train(spec, sink=first, control=control, artifacts_dir=tmp_path / "a", store=target)
    assert [c.step for c in first.checkpoints] == [1, 2]
    uri = first.checkpoints[-1].uri
    assert uri == f"{s3_store_url}/run-y/checkpoints/step-00000002"
    # Retention (keep 1): step 1's checkpoint is gone from the store and the disk; every
    # step's exports stay (the tiny model trains all weights: hf).
    assert stored_steps(store, "run-y") == [2]
    assert [p.name for p in (tmp_path / "a" / "checkpoints").iterdir()] == ["step-00000002"]
    for step in (1, 2):
        names = {o.key.rsplit("/", 1)[1] for o in store.list(f"run-y/exports/step-{step:08d}/hf")}
        assert {"model.safetensors", "config.json", "rlaas_export.json"} <= names

    rest = MemorySink()
    train(spec, sink=rest, artifacts_dir=tmp_path / "b", resume_from=uri, store=target)
    assert [s for s, _ in rest.steps] == [3]
    for name in ("reward/mean", "loss", "grad_norm", "episode/length_mean"):
        assert rest.steps[0][1][name] == pytest.approx(whole.steps[2][1][name], rel=1e-4), name
    ids = {t.episode_id for t in rest.trajectories if t.step == 3}
    assert ids == {t.episode_id for t in whole.trajectories if t.step == 3}
    # The second host's checkpoint of step 3 went up too, and retention left it alone.
    assert stored_steps(store, "run-y") == [3]
