"""A prompt's own tokens scored under a model's weights: Tinker's prompt logprobs.

``sample(..., include_prompt_logprobs=True)`` and ``compute_logprobs`` answer, for each
prompt position i >= 1, log p(prompt[i] | prompt[:i]) (position 0 has no context: None),
and with ``topk_prompt_logprobs=k`` the k likeliest tokens there. They are the model's
own distribution (temperature 1), computed as the trainer computes a datum's logprobs:
the same forward over the input ``prompt[:-1]``, padded to the same length bucket, and a
float32 log-softmax, so a prompt scored here equals ``forward_backward``'s logprobs of
the same tokens under the same weights (tests/app/test_tinker_prompt_logprobs.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_core.models.decoder import Model


@dataclasses.dataclass(frozen=True)
class PromptScores:
    logprobs: list[float | None]  # [P]; None where not scored (position 0, before last_n)
    topk: list[list[tuple[int, float]] | None] | None  # [P] rows of (id, logprob), or None


def _bucket(n: int, max_len: int) -> int:
    """`primitives._bucket`: the trainer pads a datum of n input tokens to this length."""
    return min(max(16, 1 << (n - 1).bit_length()), max_len)


@functools.cache
def _program(graphdef: Any, k: int) -> Any:
    @jax.jit
    def run(state: Any, tokens: jax.Array, targets: jax.Array) -> tuple[jax.Array, ...]:
        # tokens, targets [1, T]: the input prompt[:-1] and the tokens it predicts
        model = nnx.merge(graphdef, state)
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        logits, _ = model(tokens, positions)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [1, T, V]
        lp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # [1, T]
        if not k:
            return (lp,)
        values, ids = jax.lax.top_k(logp, k)  # [1, T, k], likeliest first
        return lp, values, ids

    return run


def score_prompt(
    model: Model,
    weights: Any,  # nnx.State of ``model``: the weights a sampler samples with
    prompt: Sequence[int],
    *,
    last_n: int | None = None,
    topk: int = 0,
) -> PromptScores:
    """Log-probabilities of ``prompt[1:]`` (and, with ``topk``, the top-k rows) under
    ``weights``; only the last ``last_n`` positions when it is given."""
    n = len(prompt)
    graphdef, _ = nnx.split(model)
    scored_from = 1 if last_n is None else n - last_n  # first position that gets a number
    lps: list[float | None] = [None] * n
    rows: list[list[tuple[int, float]] | None] = [None] * n
    if n >= 2:
        length = _bucket(n - 1, model.config.max_seq_len)
        tokens = np.zeros((1, length), np.int32)
        targets = np.zeros((1, length), np.int32)
        tokens[0, : n - 1], targets[0, : n - 1] = prompt[:-1], prompt[1:]
        out = _program(graphdef, topk)(weights, jnp.asarray(tokens), jnp.asarray(targets))
        lp = np.asarray(out[0])[0]
        for i in range(scored_from, n):
            lps[i] = float(lp[i - 1])
        if topk:
            values, ids = np.asarray(out[1])[0], np.asarray(out[2])[0]
            for i in range(scored_from, n):
                rows[i] = [
                    (int(t), float(v)) for t, v in zip(ids[i - 1], values[i - 1], strict=True)
                ]
    return PromptScores(lps, rows if topk else None)


__all__ = ["PromptScores", "score_prompt"]
