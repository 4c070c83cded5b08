"""One LoRA adapter applied unmerged in the trainer's forward: ``y = x W + scale (x A) B``.

Merged (`lora.merged_params`), the forward uses ``W' = W + scale * A @ B`` and autodiff
reaches A and B through W': the backward first forms the full weight gradient
``dW' = x^T dy`` of every adapted kernel, a ``[d_in, d_out]`` matmul over all the batch's
tokens, then projects it onto A and B. That matmul is the cost of training the frozen
weight, paid for a rank-r update. Unmerged, the adapter's own gradients are all that is
formed::

    dB = (x A)^T dy          [r, d_out]
    dA = x^T (dy B^T)        [d_in, r]

each about ``r / d_out`` of the full one. The forward pays one extra ``x A`` and ``(.)B``
per target (also rank-r sized), and the two paths compute the same function: their
gradients agree to float32 rounding (tests/rl_core/training/test_lora_unmerged.py).
bench/p1_chunked_logits.py ``--lora-apply`` measures both (bench/README.md, P1).

The model code is not forked: `lora_model` merges the base model from its state and
wraps each adapted Linear (the base kernel itself, not a copy), as
`multi_lora.multi_lora_model` does for many adapters; the wrapping happens while tracing.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rl_core.training.lora import Adapters, LoraConfig
from rl_core.training.multi_lora import wrap_linears


class LoraLinear(nnx.Module):
    """A base `nnx.Linear` (held, not copied) plus its low-rank delta, unmerged."""

    def __init__(self, base: nnx.Linear, a: jax.Array, b: jax.Array, *, scale: float) -> None:
        self.base = base
        # Plain data: this module lives only inside one traced call and is never split.
        self.a, self.b = nnx.data(a), nnx.data(b)  # [d_in, r], [r, d_out]
        self.scale = scale

    def __call__(self, x: jax.Array) -> jax.Array:  # [..., d_in] -> [..., d_out]
        y = self.base(x)
        f32 = jnp.float32
        delta = (x.astype(f32) @ self.a.astype(f32)) @ self.b.astype(f32)
        return (y.astype(f32) + self.scale * delta).astype(y.dtype)


def lora_model(
    graphdef: Any,
    base: Any,  # nnx.State of the base's Params
    rest: Any,  # the rest of the base's state
    adapters: Adapters,
    config: LoraConfig,
) -> Any:  # the base's own class (a `Model`), its adapted Linears wrapped
    """The base model with ``adapters`` applied unmerged; call it as the base model.
    Meant for inside a jitted function; ``base`` is used as is, never copied."""
    model = nnx.merge(graphdef, base, rest)

    def wrap(name: str, linear: nnx.Linear) -> nnx.Module:
        return LoraLinear(linear, adapters[name]["a"], adapters[name]["b"], scale=config.scale)

    wrap_linears(model, set(adapters), wrap)
    return model
