"""Sharded forward and train step equal the unsharded ones (8 fake CPU devices, subprocess).

XLA's device count is fixed when JAX starts, so the check runs in its own interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from jax.sharding import PartitionSpec as P

from rl_core.models.sharding import make_mesh, spec_for

ROOT = Path(__file__).resolve().parents[3]


def test_sharded_forward_and_train_step_equal_unsharded() -> None:
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=str(ROOT),
    )
    done = subprocess.run(
        [sys.executable, "-m", "tests.rl_core.models.sharding_check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["devices"] == 8
    # q kernel [64, 64]: rows over fsdp (2), columns (heads) over tensor (2).
    assert report["q_spec"] == ["fsdp", "tensor"] and report["q_shard_shape"] == [32, 32]
    assert report["q_spec_after_step"] == ["fsdp", "tensor"]  # the update kept the layout
    assert report["logits_max_diff"] <= 1e-5
    want_loss, got_loss = report["loss"]
    assert abs(want_loss - got_loss) <= 1e-5
    assert report["grad_norm"][0] == pytest.approx(report["grad_norm"][1], rel=1e-4)
    assert report["params_moved"] > 5e-3  # the step did change the weights...
    # ...the same with and without the mesh. Adam's first step is about lr * sign(g), so a
    # gradient entry near 0 turns float reduction-order noise into a visible difference;
    # 1e-3 is a tenth of the step (lr 1e-2), far below a wrong update.
    assert report["params_max_diff"] <= 1e-3


def test_axes_that_do_not_divide_a_dimension_are_dropped() -> None:
    mesh = make_mesh(devices=jax.devices()[:1])
    assert spec_for(("blocks", 0, "attn", "q", "kernel"), (64, 64), mesh) == P("fsdp", "tensor")
    assert spec_for(("final_norm", "scale"), (64,), mesh) == P(None)
    with pytest.raises(ValueError, match="needs 8 devices"):
        make_mesh(data=2, fsdp=2, tensor=2, devices=jax.devices()[:1])
