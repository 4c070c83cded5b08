"""Many adapters on one base: each row's logits and each slot's gradient are those of its
own adapter merged alone (`lora.merged_params`, the single-adapter path), for both
grouped products. Tolerance: float32, 1e-5 absolute on logits and 1e-5 on gradients
(unmerged x W + s (x A) B and merged x (W + s A B) differ only in rounding)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.models import Model, ModelConfig
from rl_core.models.lora import Adapters, LoraConfig, merged_params
from rl_core.models.multi_lora import (
    IMPLS,
    StackedAdapters,
    delta_gather,
    delta_ragged,
    init_stacked,
    multi_lora_model,
    slot_adapters,
)

# One attention and one MLP target of each shape kind (square, d -> f, f -> d).
LORA = LoraConfig(rank=4, alpha=8.0, targets=("q", "up", "down"))
SLOTS = 3
T = 8


@pytest.fixture(scope="module")
def setup(tiny_config: ModelConfig) -> tuple[Any, ...]:  # graphdef base rest stacked tokens single
    model = Model(tiny_config, rngs=nnx.Rngs(0))
    graphdef, base, rest = nnx.split(model, nnx.Param, ...)  # type: ignore[misc]
    stacked = init_stacked(base, LORA, jax.random.key(0), SLOTS)
    # B != 0 and different per slot: a fresh adapter is a no-op and would prove nothing.
    rng = np.random.default_rng(0)
    stacked = jax.tree.map(lambda x: x + 0.05 * rng.standard_normal(x.shape, np.float32), stacked)
    tokens = jnp.asarray(rng.integers(0, tiny_config.vocab_size, (4, T)), jnp.int32)
    single = jax.jit(functools.partial(_single_logits, graphdef, base, rest))
    return graphdef, base, rest, stacked, tokens, single


def _positions(tokens: jax.Array) -> jax.Array:
    return jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)


def _ce(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """Summed next-token cross-entropy of each row: [B, T, V] -> [B]."""
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    return -jnp.sum(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0], axis=1)


def _single_logits(graphdef: Any, base: Any, rest: Any, ad: Adapters, tok: jax.Array) -> Any:
    model = nnx.merge(graphdef, merged_params(base, ad, LORA), rest)
    return model(tok, _positions(tok))[0]


@pytest.mark.parametrize("impl", IMPLS)
def test_each_row_gets_the_logits_of_its_own_adapter_merged_alone(
    setup: tuple[Any, ...], impl: Any
) -> None:
    graphdef, base, rest, stacked, tokens, single = setup
    slots = jnp.array([2, 0, 1, 2], jnp.int32)  # unsorted, one slot twice
    model = multi_lora_model(graphdef, base, rest, stacked, slots, LORA, impl=impl)
    logits = jax.jit(lambda t: model(t, _positions(t))[0])(tokens)
    for row, slot in enumerate(slots.tolist()):
        alone = single(slot_adapters(stacked, slot), tokens[row : row + 1])
        np.testing.assert_allclose(logits[row], alone[0], atol=1e-5, rtol=0)
    # The adapters matter: slot 0's row differs from the same tokens under slot 2.
    other = single(slot_adapters(stacked, 2), tokens[1:2])
    assert float(jnp.abs(logits[1] - other[0]).max()) > 1e-3


@pytest.mark.parametrize("impl", IMPLS)
def test_each_slot_gets_its_own_gradient_and_an_absent_slot_none(
    setup: tuple[Any, ...], impl: Any
) -> None:
    graphdef, base, rest, stacked, tokens, single = setup
    slots = jnp.array([0, 2, 2, 0], jnp.int32)  # slot 1 has no rows

    def multi_loss(st: StackedAdapters) -> jax.Array:
        model = multi_lora_model(graphdef, base, rest, st, slots, LORA, impl=impl)
        return jnp.sum(_ce(model(tokens, _positions(tokens))[0], tokens))

    grads = jax.jit(jax.grad(multi_loss))(stacked)

    def alone_loss(ad: Adapters, tok: jax.Array) -> jax.Array:
        return jnp.sum(_ce(single(ad, tok), tok))

    alone_grad = jax.jit(jax.grad(alone_loss))
    for slot in (0, 2):
        rows = tokens[np.asarray(slots) == slot]
        expected = alone_grad(slot_adapters(stacked, slot), rows)
        got = slot_adapters(grads, slot)
        assert sorted(got) == sorted(expected)
        for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
            assert float(jnp.abs(e).max()) > 0  # a real gradient, not two zeros
            np.testing.assert_allclose(g, e, atol=1e-5, rtol=1e-4)
    for leaf in jax.tree.leaves(slot_adapters(grads, 1)):
        np.testing.assert_array_equal(leaf, np.zeros_like(leaf))


@pytest.mark.parametrize("impl", IMPLS)
def test_a_slot_per_token_is_each_tokens_own_adapter(impl: Any) -> None:
    """Per-token slots ([B, T], the engine's packed prefill: one row, several requests)
    give each token the product of its own slot's adapter."""
    rng = np.random.default_rng(1)
    b, t, d_in, r, d_out, n_slots = 2, 5, 8, 3, 6, 3
    x = jnp.asarray(rng.standard_normal((b, t, d_in)), jnp.float32)
    a = jnp.asarray(rng.standard_normal((n_slots, d_in, r)), jnp.float32)
    bb = jnp.asarray(rng.standard_normal((n_slots, r, d_out)), jnp.float32)
    slots = jnp.asarray([[2, 2, 0, 1, 1], [0, 1, 2, 0, 2]], jnp.int32)
    delta = {"gather": delta_gather, "ragged": delta_ragged}[impl]
    got = jax.jit(delta)(x, a, bb, slots)
    for i in range(b):
        for j in range(t):
            s = int(slots[i, j])
            np.testing.assert_allclose(got[i, j], x[i, j] @ a[s] @ bb[s], atol=1e-5, rtol=1e-5)
