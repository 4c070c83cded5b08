"""LoRA adapters: start as a no-op, merge as W + (alpha / r) A B, touch only their targets."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.errors import UnsupportedSpec
from rl_core.models import Model
from rl_core.models.lora import LoraConfig, count_adapter_params, init_adapters, merged_params


def test_fresh_adapters_change_nothing(tiny_model: Model) -> None:
    params = nnx.state(tiny_model, nnx.Param)
    config = LoraConfig(rank=4, targets=("q", "o", "down"))
    adapters = init_adapters(params, config, jax.random.key(0))
    assert sorted(adapters) == [
        f"blocks.{i}.{m}" for i in range(2) for m in ("attn.o", "attn.q", "mlp.down")
    ]
    q = adapters["blocks.0.attn.q"]
    assert q["a"].shape == (64, 4) and q["b"].shape == (4, 64) and float(jnp.abs(q["b"]).sum()) == 0
    assert count_adapter_params(adapters) == 2 * (64 * 4 + 4 * 64) * 2 + 2 * (192 * 4 + 4 * 64)
    for a, b in zip(
        jax.tree.leaves(params),
        jax.tree.leaves(merged_params(params, adapters, config)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


def test_merge_adds_the_scaled_low_rank_product_to_targets_only(tiny_model: Model) -> None:
    params = nnx.state(tiny_model, nnx.Param)
    config = LoraConfig(rank=2, alpha=6.0, targets=("v",))
    adapters = init_adapters(params, config, jax.random.key(1))
    b = jax.random.normal(jax.random.key(2), (2, 32))
    adapters["blocks.1.attn.v"]["b"] = b
    merged = merged_params(params, adapters, config)
    kernel = params["blocks"][1]["attn"]["v"]["kernel"][...]
    expected = kernel + 3.0 * adapters["blocks.1.attn.v"]["a"] @ b
    np.testing.assert_allclose(
        merged["blocks"][1]["attn"]["v"]["kernel"][...], expected, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(  # other block's adapter is still B = 0
        merged["blocks"][0]["attn"]["v"]["kernel"][...],
        params["blocks"][0]["attn"]["v"]["kernel"][...],
    )
    np.testing.assert_array_equal(
        merged["embed"]["embedding"][...], params["embed"]["embedding"][...]
    )


def test_unknown_targets_are_refused_with_the_choices() -> None:
    with pytest.raises(UnsupportedSpec, match=r"model\.lora\.targets.*'qkv'.*gate"):
        LoraConfig(targets=("qkv",))


def test_a_model_without_matching_kernels_is_refused() -> None:
    params = {"head": {"kernel": jnp.zeros((4, 4))}}
    with pytest.raises(UnsupportedSpec, match="no kernel"):
        init_adapters(params, LoraConfig(targets=("q",)), jax.random.key(0))
