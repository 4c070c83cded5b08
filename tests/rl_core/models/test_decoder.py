from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.models import Model, ModelConfig
from rl_core.models.config import PRESETS
from rl_core.models.decoder import count_params


def test_tiny_preset_is_about_a_hundred_thousand_params(tiny_model: Model) -> None:
    assert 50_000 < count_params(tiny_model) < 200_000


def test_config_rejects_bad_head_counts() -> None:
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        ModelConfig.tiny(n_heads=4, n_kv_heads=3)


def test_forward_shapes(tiny_model: Model, tiny_config: ModelConfig) -> None:
    tokens = jnp.zeros((3, 7), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(7), (3, 7))
    logits, cache = tiny_model(tokens, positions)
    assert logits.shape == (3, 7, tiny_config.vocab_size)
    assert logits.dtype == jnp.float32
    assert cache is None


def test_embeddings_are_tied(tiny_model: Model) -> None:
    params = nnx.state(tiny_model, nnx.Param)
    names = {"/".join(str(k) for k in path) for path, _ in nnx.to_flat_state(params)}
    assert not any("lm_head" in n or "unembed" in n for n in names)


@pytest.mark.parametrize("preset", ["tiny", "tiny-alibi"])
def test_prefill_then_decode_matches_full_forward(preset: str) -> None:
    """Two rows at different lengths in one cache, one token at a time, vs. a plain forward
    (with ALiBi, a cache slot's distance must be the token's)."""
    tiny_model = Model(PRESETS[preset](), rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    seqs = [rng.integers(3, 100, size=9) for _ in range(2)]
    lengths, bucket, extra = [4, 3], 6, 5  # prompt lengths, padded prompt length, new tokens
    tokens = np.zeros((2, bucket), np.int32)
    for i, (s, n) in enumerate(zip(seqs, lengths, strict=True)):
        tokens[i, :n] = s[:n]  # right-padded: each row's real tokens start at slot 0
    valid = np.arange(bucket)[None, :] < np.asarray(lengths)[:, None]
    positions = np.broadcast_to(np.arange(bucket), (2, bucket))
    # Jitted only to keep the test fast; eager gives the same numbers.
    cached = nnx.jit(lambda m, t, p, v, c: m(t, p, valid=v, cache=c))
    full_forward = nnx.jit(lambda m, t: m(t, jnp.arange(t.shape[1])[None])[0])
    cache = tiny_model.init_cache(2, bucket + extra)
    logits, cache = cached(
        tiny_model, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(valid), cache
    )
    assert cache is not None and cache.lengths.tolist() == lengths
    got = [[logits[i, lengths[i] - 1]] for i in range(2)]
    for t in range(extra - 1):
        step_tok = np.array([[seqs[i][lengths[i] + t]] for i in range(2)], np.int32)
        step_pos = np.asarray(cache.lengths)[:, None]
        out, cache = cached(
            tiny_model, jnp.asarray(step_tok), jnp.asarray(step_pos), jnp.ones((2, 1), bool), cache
        )
        for i in range(2):
            got[i].append(out[i, 0])
    for i in range(2):
        n = lengths[i] + extra - 1
        full = full_forward(tiny_model, jnp.asarray(seqs[i][None, :n]))
        want = np.asarray(full[0, lengths[i] - 1 : n])
        np.testing.assert_allclose(np.stack(got[i]), want, atol=1e-5, rtol=0)
