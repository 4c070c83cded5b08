"""The sampler draws from exactly the distribution whose logprob it reports.

`draw` picks a block of the vocabulary, then a token inside it; these tests check the
frequencies of many draws against the probabilities, on vocabularies that do and do not
fill their last block, with tokens cut by top-k and top-p.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core.rollout.sampling import draw, filter_logits, no_controls, sample

N = 40_000  # draws per row: a frequency's standard error is under 0.0025


def _frequencies(logp: jax.Array, seed: int) -> np.ndarray:  # [V] log-probs -> [V]
    keys = jax.random.split(jax.random.key(seed), N)
    tokens = jax.jit(draw)(keys, jnp.broadcast_to(logp, (N, logp.shape[0])))
    return np.bincount(np.asarray(tokens), minlength=logp.shape[0]) / N


@pytest.mark.parametrize("vocab", [2, 37, 64, 300])
def test_draws_follow_the_softmax(vocab: int) -> None:
    logits = jax.random.normal(jax.random.key(vocab), (vocab,)) * 2.0
    probs = np.asarray(jax.nn.softmax(logits))
    freq = _frequencies(jax.nn.log_softmax(logits), seed=1)
    assert freq.shape == (vocab,)
    np.testing.assert_allclose(freq, probs, atol=0.012)


def test_tokens_cut_by_top_k_and_top_p_are_never_drawn() -> None:
    vocab = 50
    logits = jax.random.normal(jax.random.key(0), (1, vocab)) * 3.0
    for top_k, top_p in ((5, 1.0), (0, 0.6), (8, 0.9)):
        logp = filter_logits(logits, jnp.ones(1), jnp.array([top_k]), jnp.array([top_p]))[0]
        freq = _frequencies(logp, seed=top_k)
        kept = np.isfinite(np.asarray(logp))
        assert freq[~kept].sum() == 0
        np.testing.assert_allclose(freq[kept], np.exp(np.asarray(logp)[kept]), atol=0.012)


def test_a_whole_block_cut_is_skipped() -> None:
    # 64 tokens in blocks of 8: only tokens 3 and 60 are allowed, every other block is empty.
    logp = jnp.full((64,), -jnp.inf).at[3].set(jnp.log(0.25)).at[60].set(jnp.log(0.75))
    freq = _frequencies(logp, seed=7)
    assert set(np.flatnonzero(freq)) == {3, 60}
    assert abs(freq[60] - 0.75) < 0.012


def test_sample_reports_the_logprob_of_the_drawn_token() -> None:
    logits = jax.random.normal(jax.random.key(3), (4, 100))
    keys = jax.random.split(jax.random.key(4), 4)
    temperature = jnp.array([0.0, 0.7, 1.0, 1.3])
    tokens, logprobs, _, _ = sample(
        logits, keys, no_controls(temperature, jnp.zeros(4, jnp.int32), jnp.ones(4), 100)
    )
    assert int(tokens[0]) == int(jnp.argmax(logits[0])) and float(logprobs[0]) == 0.0
    for row in range(1, 4):
        expected = jax.nn.log_softmax(logits[row] / temperature[row])[tokens[row]]
        assert float(logprobs[row]) == pytest.approx(float(expected), abs=1e-6)
