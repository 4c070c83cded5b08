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
from llguidance.numpy import apply_token_bitmask_inplace

from rl_core.rollout.sampling import (
    TOP_LOGPROBS,
    Controls,
    constrain,
    draw,
    filter_logits,
    no_controls,
    penalise,
    sample,
    unpack_bitmask,
)
from rl_core.rollout.sampling import top_k as blocked_top_k

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


def _controls(b: int, v: int, **kw: jax.Array) -> Controls:
    return no_controls(jnp.ones(b), jnp.zeros(b, jnp.int32), jnp.ones(b), v)._replace(**kw)


def test_penalties_are_openais() -> None:
    """logit - frequency * count - presence * (count > 0), per row; then the distribution."""
    b, v = 3, 40
    logits = jax.random.normal(jax.random.key(5), (b, v)) * 2.0
    seen = jax.random.randint(jax.random.key(6), (b, v), 0, 3) * (jnp.arange(v) % 3 == 0)
    frequency = jnp.array([0.0, 0.5, -0.3])
    presence = jnp.array([0.0, 1.0, 0.25])
    count = np.asarray(seen, np.float64)
    expected = (
        np.asarray(logits, np.float64)
        - np.asarray(frequency)[:, None] * count
        - np.asarray(presence)[:, None] * (count > 0)
    )
    got = jax.jit(penalise)(logits, seen, frequency, presence)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_array_equal(got[0], logits[0])  # no penalty: untouched

    keys = jax.random.split(jax.random.key(7), b)
    controls = _controls(b, v, frequency=frequency, presence=presence)
    sampled = jax.jit(sample)(logits, keys, controls, seen)
    for row in range(b):
        logp = np.asarray(jax.nn.log_softmax(jnp.asarray(expected[row], jnp.float32)))
        t = int(sampled.token[row])
        assert float(sampled.logprob[row]) == pytest.approx(float(logp[t]), abs=1e-5)
    # A penalty that large makes a seen token unreachable in practice.
    heavy = _controls(b, v, presence=jnp.full((b,), 100.0))
    tokens = jax.jit(sample)(logits, keys, heavy, seen).token
    assert all(int(seen[r, int(tokens[r])]) == 0 for r in range(b))


def test_the_bitmask_is_llguidances() -> None:
    """Bit v % 32 of word v // 32 allows token v: our unpacking against llguidance's own
    numpy reference, on a vocabulary that does not fill its last word."""
    v = 75
    rng = np.random.default_rng(0)
    bits = rng.integers(-(2**31), 2**31, size=(4, 3), dtype=np.int64).astype(np.int32)
    reference = np.zeros((4, v), np.float32)
    apply_token_bitmask_inplace(reference, bits.copy())
    ours = np.asarray(unpack_bitmask(jnp.asarray(bits), v))
    np.testing.assert_array_equal(ours, np.isfinite(reference))


def test_masked_tokens_are_never_drawn_and_the_rest_renormalise() -> None:
    v = 50
    logits = jax.random.normal(jax.random.key(1), (v,)) * 2.0
    allowed_ids = np.array([1, 7, 8, 31, 32, 49])
    bits = np.zeros((1, 2), np.int64)
    for t in allowed_ids:
        bits[0, t // 32] |= 1 << (t % 32)
    mask = jnp.asarray(bits.astype(np.uint32).view(np.int32))
    masked = jax.jit(constrain)(logits[None], jnp.array([True]), mask)[0]
    logp = jax.nn.log_softmax(masked)
    freq = _frequencies(logp, seed=3)
    assert set(np.flatnonzero(freq)) <= set(allowed_ids.tolist())
    expected = np.asarray(jax.nn.log_softmax(logits[allowed_ids]))
    np.testing.assert_allclose(np.asarray(logp)[allowed_ids], expected, atol=1e-6)
    # An unconstrained row beside it is untouched.
    two = jax.jit(constrain)(
        jnp.stack([logits, logits]), jnp.array([True, False]), jnp.tile(mask, (2, 1))
    )
    np.testing.assert_array_equal(two[1], logits)


def test_top_alternatives_are_sorted_and_greedy_starts_with_its_token() -> None:
    b, v = 4, 64
    logits = jax.random.normal(jax.random.key(9), (b, v)) * 2.0
    keys = jax.random.split(jax.random.key(10), b)
    temperature = jnp.array([0.0, 0.5, 1.0, 2.0])
    controls = _controls(b, v, temperature=temperature, top=jnp.ones(b, bool))
    s = jax.jit(sample)(logits, keys, controls)
    assert s.top_ids.shape == (b, TOP_LOGPROBS)
    for row in range(b):
        values = np.asarray(s.top_logprobs[row])
        assert (np.diff(values) <= 0).all()
        scale = 1.0 if temperature[row] <= 0 else float(temperature[row])
        dist = np.asarray(jax.nn.log_softmax(logits[row] / scale))
        np.testing.assert_allclose(values, dist[np.asarray(s.top_ids[row])], atol=1e-5)
        np.testing.assert_allclose(values, np.sort(dist)[::-1][:TOP_LOGPROBS], atol=1e-5)
    assert int(s.top_ids[0, 0]) == int(s.token[0]) == int(jnp.argmax(logits[0]))
    # Nobody asks: nothing is computed, and the sample is the same.
    plain = jax.jit(sample)(logits, keys, controls._replace(top=jnp.zeros(b, bool)))
    np.testing.assert_array_equal(plain.token, s.token)
    assert np.isneginf(np.asarray(plain.top_logprobs)).all()


@pytest.mark.parametrize("vocab", [30, 49_152])
def test_blocked_top_k_is_lax_top_k(vocab: int) -> None:
    """The blocked top-k of large vocabularies against the plain sort, ties included."""
    x = jax.random.normal(jax.random.key(vocab), (4, vocab))
    x = x.at[1, 7].set(9.0).at[1, vocab - 3].set(9.0)  # a tie at the top, far apart
    x = jnp.round(x * 4) / 4  # many ties everywhere
    values, ids = jax.jit(blocked_top_k, static_argnums=1)(x, 20)
    want_values, want_ids = jax.lax.top_k(x, 20)
    np.testing.assert_array_equal(values, want_values)
    np.testing.assert_array_equal(ids, want_ids)
