"""Training primitives as the Tinker API has them: one LoRA adapter over a frozen base model.

``forward_backward`` scores a batch of datums and *adds* their loss's gradient to an
accumulator (a client splits a big batch into several calls); ``optim_step`` applies
Adam with the hyperparameters the call brings, then clears the accumulator. Losses are
sums over tokens, as Tinker defines them: ``cross_entropy`` is
``-sum(weights * logp(target))``; the policy-gradient losses (``importance_sampling``,
``ppo``, ``cispo``, ``dro``, ``gspo``) are in `rl_core.training.losses`, their
``loss_fn_config`` in `rl_core.protocol.tinker_losses`.

Each datum is ``tokens[T]`` (the model's input) and inputs aligned with it
(``target_tokens[T]``: the token that follows each position). Batches are padded to a
power-of-two length so a few shapes compile, not one per batch.

`LoraModel` is the plain path (one datum a row, the adapter merged, every position's
logits at once), kept as the reference the tests hold the served trainer to: the worker
trains with `rl_core.training.multi_trainer.MultiLoraTrainer`, which packs a call's
datums into rows and runs the output head in chunks.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_core.errors import UnsupportedSpec
from rl_core.models.decoder import Model
from rl_core.protocol.tinker_losses import LOSS_INPUTS, resolve_config
from rl_core.training.lora import Adapters, LoraConfig, init_adapters, merged_params
from rl_core.training.losses import PER_TOKEN


@dataclasses.dataclass(frozen=True)
class Datum:
    tokens: Sequence[int]
    inputs: dict[str, Sequence[float]]  # target_tokens and the loss's own, each [T]


@dataclasses.dataclass(frozen=True)
class AdamParams:
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0  # 0: no clipping


def _bucket(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def token_loss(
    logits: jax.Array,  # [B, T, V]
    batch: dict[str, jax.Array],  # a `pack_batch` batch
    loss_fn: str,
) -> tuple[jax.Array, jax.Array]:  # each token's loss [B, T] (0 at padding), target logp [B, T]
    """Tinker's losses per token from every position's logits (the reference path)."""
    logp_all = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    lp = jnp.take_along_axis(logp_all, batch["target_tokens"][..., None], axis=-1)[..., 0]
    return per_token_loss(lp, batch, loss_fn)


def per_token_loss(
    lp: jax.Array,  # [B, T] log pi(target)
    batch: dict[str, jax.Array],
    loss_fn: str,
) -> tuple[jax.Array, jax.Array]:  # each token's loss [B, T] (0 at padding), target logp [B, T]
    """Tinker's losses per token, so a caller can sum them per row (several models in one
    batch) or over the batch."""
    mask = batch["mask"]
    # where, not a product: a padding position counts nothing even where a loss is not
    # finite there
    per_token = jnp.where(mask > 0, PER_TOKEN[loss_fn](lp, batch), 0.0)
    return per_token, lp * mask


def _loss(
    adapters: Adapters,
    base: Any,
    rest: Any,
    batch: dict[str, jax.Array],
    *,
    graphdef: Any,
    lora: LoraConfig,
    loss_fn: str,
) -> tuple[jax.Array, jax.Array]:
    model = nnx.merge(graphdef, merged_params(base, adapters, lora), rest)
    tokens = batch["tokens"]
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    logits, _ = model(tokens, positions)
    per_token, lp = token_loss(logits, batch, loss_fn)
    return jnp.sum(per_token), lp


@functools.cache
def _compiled(graphdef: Any, lora: LoraConfig, loss_fn: str, forward_only: bool) -> Any:
    """The jitted loss (and gradient) of one architecture: shared by every adapter on it,
    so a second model on a base compiles nothing."""
    loss = functools.partial(_loss, graphdef=graphdef, lora=lora, loss_fn=loss_fn)
    return jax.jit(loss if forward_only else jax.value_and_grad(loss, has_aux=True))


@jax.jit
def adam_update(
    w: Adapters,
    m: Adapters,
    v: Adapters,
    g: Adapters,
    t: jax.Array,
    lr: jax.Array,
    beta1: jax.Array,
    beta2: jax.Array,
    eps: jax.Array,
    weight_decay: jax.Array,
    clip: jax.Array,
) -> tuple[Adapters, Adapters, Adapters, jax.Array]:
    """One Adam step; the hyperparameters are traced, so each call may bring its own
    without compiling again."""
    norm = jnp.sqrt(sum(jnp.sum(x.astype(jnp.float32) ** 2) for x in jax.tree.leaves(g)))
    scale = jnp.where((clip > 0) & (norm > clip), clip / norm, 1.0)
    m = jax.tree.map(lambda m, g: beta1 * m + (1 - beta1) * g * scale, m, g)
    v = jax.tree.map(lambda v, g: beta2 * v + (1 - beta2) * (g * scale) ** 2, v, g)
    c1, c2 = 1 - beta1**t, 1 - beta2**t

    def step(w: jax.Array, m: jax.Array, v: jax.Array) -> jax.Array:
        update = (m / c1) / (jnp.sqrt(v / c2) + eps) + weight_decay * w
        return (w - lr * update).astype(w.dtype)

    return jax.tree.map(step, w, m, v), m, v, norm


def pack_batch(
    data: Sequence[Datum],
    loss_fn: str,
    max_len: int,
    config: Mapping[str, float | str] | None = None,
) -> dict[str, jax.Array]:
    """`host_batch` on the device."""
    return {k: jnp.asarray(v) for k, v in host_batch(data, loss_fn, max_len, config).items()}


def host_batch(
    data: Sequence[Datum],
    loss_fn: str,
    max_len: int,
    config: Mapping[str, float | str] | None = None,
) -> dict[str, np.ndarray]:
    """Datums as padded host arrays [B, T] (T a power of two, at most ``max_len``), every
    field checked: a bad datum is refused naming its index and field. The loss's config
    values (``loss_fn_config``, its defaults filled in) ride along as [B, T] arrays."""
    resolved = resolve_config(loss_fn, config)
    if not data:
        raise UnsupportedSpec("data", "forward_backward needs at least one datum")
    needed = ("target_tokens", *LOSS_INPUTS[loss_fn])
    for i, d in enumerate(data):
        if not 0 < len(d.tokens) <= max_len:
            raise UnsupportedSpec(
                f"data[{i}].model_input",
                f"has {len(d.tokens)} tokens; send 1 to {max_len} (the base's context)",
            )
    length = min(_bucket(max(len(d.tokens) for d in data)), max_len)
    arrays = {name: np.zeros((len(data), length), np.float32) for name in needed}
    tokens = np.zeros((len(data), length), np.int32)
    mask = np.zeros((len(data), length), np.float32)
    for i, d in enumerate(data):
        n = len(d.tokens)
        tokens[i, :n], mask[i, :n] = d.tokens, 1.0
        for name in needed:
            values = d.inputs.get(name)
            if values is None or len(values) != n:
                raise UnsupportedSpec(
                    f"data[{i}].loss_fn_inputs.{name}",
                    f"{loss_fn} needs {name} with one value per input token ({n})",
                )
            arrays[name][i, :n] = values
        if "sequence_ratio_mask" in needed and not np.any(arrays["sequence_ratio_mask"][i, :n]):
            raise UnsupportedSpec(
                f"data[{i}].loss_fn_inputs.sequence_ratio_mask",
                "marks no token; gspo's sequence ratio is a mean over the tokens it marks "
                "(the sampled ones)",
            )
    for key, value in resolved.items():
        arrays[key] = np.full((len(data), length), value, np.float32)
    out: dict[str, np.ndarray] = {**arrays, "tokens": tokens, "mask": mask}
    out["target_tokens"] = arrays["target_tokens"].astype(np.int32)
    return out


class LoraModel:
    """One tenant's adapter on a base `Model` (which it never changes), its gradient
    accumulator and Adam moments."""

    def __init__(self, model: Model, *, rank: int, seed: int, lora: LoraConfig | None = None):
        if rank < 1:
            raise UnsupportedSpec("lora_config.rank", f"rank must be at least 1, got {rank}")
        self.lora = lora or LoraConfig(rank=rank, alpha=float(rank), targets=("q", "k", "v", "o"))
        self.max_len: int = model.config.max_seq_len
        graphdef, base, rest = nnx.split(model, nnx.Param, ...)  # type: ignore[misc]
        self._graphdef, self._base, self._rest = graphdef, base, rest
        self.adapters = init_adapters(base, self.lora, jax.random.key(seed))
        zeros = functools.partial(jax.tree.map, jnp.zeros_like)
        self.grads: Adapters = zeros(self.adapters)
        self.m: Adapters = zeros(self.adapters)
        self.v: Adapters = zeros(self.adapters)
        self.steps = 0
        self._merge = jax.jit(functools.partial(merged_params, config=self.lora))

    def forward_backward(
        self,
        data: Sequence[Datum],
        loss_fn: str,
        *,
        forward_only: bool = False,
        config: Mapping[str, float | str] | None = None,
    ) -> tuple[list[list[float]], float]:
        """Each datum's target logprobs, and the batch's summed loss; unless
        ``forward_only``, the loss's gradient joins the accumulator."""
        batch = pack_batch(data, loss_fn, self.max_len, config)
        fn = _compiled(self._graphdef, self.lora, loss_fn, forward_only)
        if forward_only:
            loss, lp = fn(self.adapters, self._base, self._rest, batch)
        else:
            (loss, lp), grads = fn(self.adapters, self._base, self._rest, batch)
            self.grads = jax.tree.map(jnp.add, self.grads, grads)
        lp_np = np.asarray(lp)
        return [lp_np[i, : len(d.tokens)].tolist() for i, d in enumerate(data)], float(loss)

    def optim_step(self, p: AdamParams) -> dict[str, float]:
        """Adam (decoupled weight decay) on the accumulated gradient, which it then clears."""
        self.steps += 1
        hyper = [p.learning_rate, p.beta1, p.beta2, p.eps, p.weight_decay, p.grad_clip_norm]
        self.adapters, self.m, self.v, norm = adam_update(
            self.adapters,
            self.m,
            self.v,
            self.grads,
            jnp.float32(self.steps),
            *map(jnp.float32, hyper),
        )
        self.grads = jax.tree.map(jnp.zeros_like, self.grads)
        return {"grad_norm": float(norm), "step": float(self.steps)}

    def sampler_weights(self) -> Any:
        """The merged weights as `nnx.state(model)`: what a `JaxEngine` samples with. A copy:
        later steps never change it."""
        return nnx.merge_state(self._merge(self._base, self.adapters), self._rest)
