"""Blocks recomputed in the backward (``TrainerConfig.remat``) change no number of a step.

`Model.hidden(..., remat=True)` runs each block under `jax.checkpoint`: the backward
recomputes the block from its input instead of keeping its activations. The same
function, differentiated another way: a step's metrics and update equal the step
without it, on each layout a step may take (one batch row a row, packed rows, a group's
prompt computed once), with LoRA beside the kernels and a KL term; and the compiled step
keeps less (XLA's own temp bytes, scheduled for memory). Float32, the tolerances of the
packing and sharing tests.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from rl_core.algorithms.grpo import GrpoConfig
from rl_core.models import Model, ModelConfig
from rl_core.training.lora import LoraConfig
from rl_core.training.trainer import TrainerConfig
from tests.rl_core.training.test_packing import long_tail_batch, step_of
from tests.rl_core.training.test_prefix_shared import grpo_batch

REPO = Path(__file__).resolve().parents[3]
LORA = LoraConfig(rank=4, alpha=8.0, targets=("q", "k", "v", "o"))
LAYOUTS = {
    "plain": ({"pack": False, "share_prefix": False}, long_tail_batch),
    "packed": ({"pack": True, "share_prefix": False}, long_tail_batch),
    "shared": ({"pack": False, "share_prefix": True, "share_prefix_min": 0}, grpo_batch),
}


@pytest.fixture(scope="module")
def model(tiny_config: ModelConfig) -> Model:
    return Model(dataclasses.replace(tiny_config, n_layers=3), rngs=nnx.Rngs(0))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_step_with_blocks_recomputed_equals_the_step_without(model: Model, layout: str) -> None:
    settings, make_batch = LAYOUTS[layout]
    config = TrainerConfig(
        lora=LORA,
        lora_apply="unmerged",
        learning_rate=1e-2,
        mini_batches=2,
        micro_batches=2,
        temperature=0.7,
        grpo=GrpoConfig(entropy_coef=0.01, kl_coef=0.1),
        fit_compiled=False,
        **settings,  # type: ignore[arg-type]
    )
    batch = make_batch(5)
    want_m, want_step, want_layout = step_of(model, config, batch)
    got_m, got_step, got_layout = step_of(model, dataclasses.replace(config, remat=True), batch)
    assert got_layout == want_layout and got_layout[layout] == 2  # both updates on that path
    assert set(got_m) == set(want_m)
    for name, value in want_m.items():
        assert got_m[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    for a, b in zip(jax.tree.leaves(want_step), jax.tree.leaves(got_step), strict=True):
        assert float(jnp.linalg.norm(a)) > 0
        assert float(jnp.linalg.norm(b - a)) <= 1e-4 * float(jnp.linalg.norm(a))


# The compiled update's temp bytes (XLA's own count of a step's activations and scratch),
# with and without remat, in a process of its own: XLA's CPU scheduler must be the one
# that schedules for memory (the default schedules for concurrency and runs the
# recomputations early, keeping what they free: 4 % less there), and its flag is read
# once, when the backend starts.
TEMP_BYTES = """
import dataclasses, json
import numpy as np
from flax import nnx
from rl_core.models import Model, ModelConfig
from rl_core.training.lora import LoraConfig
from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

config = dataclasses.replace(ModelConfig.tiny(vocab_size=128), n_layers=4)
model = Model(config, rngs=nnx.Rngs(0))
rng = np.random.default_rng(0)
tokens = [rng.integers(3, 100, 200) for _ in range(8)]
masks = [np.r_[np.zeros(20), np.ones(180)] for _ in range(8)]
batch = TrainBatch.pack(tokens, masks, [-3.0 * m for m in masks], [1.0, -1.0] * 4, rows=8)
lora = LoraConfig(rank=4, alpha=8.0, targets=("q", "k", "v", "o"))
temp = {}
for remat in (False, True):
    trainer = Trainer(
        model, TrainerConfig(lora=lora, lora_apply="unmerged", pack=False, remat=remat)
    )
    mb = trainer._prepare(batch)
    compiled = trainer._update.lower(
        trainer.trainable, trainer.opt_state, trainer._frozen, trainer._rest, mb
    ).compile()
    temp[str(remat)] = compiled.memory_analysis().temp_size_in_bytes
print(json.dumps(temp))
"""


def test_a_step_with_blocks_recomputed_keeps_less() -> None:
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_cpu_enable_concurrency_optimized_scheduler=false",
    }
    out = subprocess.run(
        [sys.executable, "-c", TEMP_BYTES],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    temp = json.loads(out.stdout.strip().splitlines()[-1])
    assert temp["True"] < 0.75 * temp["False"], temp
