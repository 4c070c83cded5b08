"""Run in a subprocess by test_sharding.py, with 8 fake CPU devices; prints a JSON report.

The same tiny model and batch, once unsharded and once over a 2 x 2 x 2 mesh: a forward
and one train step through `rl_core.training.trainer` (its loss, AdamW and clipping, unchanged).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_core.models import Model, ModelConfig
from rl_core.models.sharding import batch_sharding, make_mesh, shard_model
from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig


def leaves(state: object) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(state)]


def q_kernel(state: object) -> jax.Array:
    flat = dict(nnx.to_flat_state(state))  # type: ignore[arg-type]
    return flat[("blocks", 0, "attn", "q", "kernel")].get_value()  # type: ignore[no-any-return]


def main() -> None:
    # Dimensions divisible by every axis, untied head and biases: every rule is exercised.
    config = ModelConfig.tiny(
        vocab_size=128,
        n_heads=4,
        n_kv_heads=2,
        qkv_bias=True,
        tie_embeddings=False,
        architecture="qwen2",
    )
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 128, size=(8, 16)).astype(np.int32)
    mask = np.zeros((8, 16), np.float32)
    mask[:, 6:] = 1.0
    batch = TrainBatch(
        tokens=tokens,
        loss_mask=mask,
        logprobs=np.full((8, 16), -4.0, np.float32) * mask,
        advantages=np.linspace(-1, 1, 8).astype(np.float32),
    )

    @nnx.jit
    def forward(model: Model, t: jax.Array) -> jax.Array:
        positions = jnp.broadcast_to(jnp.arange(t.shape[1]), t.shape)
        return model(t, positions)[0]

    plain = Model(config, rngs=nnx.Rngs(0))
    want_logits = np.asarray(forward(plain, jnp.asarray(tokens)))
    trainer = Trainer(plain, TrainerConfig(learning_rate=1e-2))
    want_metrics = trainer.train_step(batch)
    initial = leaves(nnx.state(plain, nnx.Param))
    want_params = leaves(nnx.state(trainer.params(), nnx.Param))

    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharded = Model(config, rngs=nnx.Rngs(0))
    shard_model(sharded, mesh)
    q = sharded.blocks[0].attn.q.kernel[...]
    with jax.set_mesh(mesh):
        got_logits = np.asarray(
            forward(sharded, jax.device_put(jnp.asarray(tokens), batch_sharding(mesh, 2)))
        )
        sharded_trainer = Trainer(sharded, TrainerConfig(learning_rate=1e-2))
        got_metrics = sharded_trainer.train_step(batch)
    got_params = leaves(nnx.state(sharded_trainer.params(), nnx.Param))
    after_q = q_kernel(sharded_trainer.params())

    print(
        json.dumps(
            {
                "devices": jax.device_count(),
                "q_spec": [str(a) for a in q.sharding.spec],
                "q_shard_shape": list(q.addressable_shards[0].data.shape),
                "q_shape": list(q.shape),
                "q_spec_after_step": [str(a) for a in after_q.sharding.spec],
                "logits_max_diff": float(np.max(np.abs(got_logits - want_logits))),
                "loss": [want_metrics["loss"], got_metrics["loss"]],
                "grad_norm": [want_metrics["grad_norm"], got_metrics["grad_norm"]],
                "params_max_diff": max(
                    float(np.max(np.abs(a - b)))
                    for a, b in zip(want_params, got_params, strict=True)
                ),
                "params_moved": max(
                    float(np.max(np.abs(a - b))) for a, b in zip(want_params, initial, strict=True)
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
