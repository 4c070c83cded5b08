"""Many LoRA adapters on one frozen base, applied unmerged, each batch row with its own.

`lora.py` merges one adapter into the base weights (``W + scale * A @ B``) before the
forward: right for one tenant, but S tenants would need S merged copies of every
targeted kernel and S forward passes. Here the base weights stay as they are, shared,
and every targeted ``nnx.Linear`` (q k v o gate up down) computes::

    y = x W (+ bias) + scale * (x A[s]) B[s]      s = the slot of x's batch row

with the adapters stacked by slot: ``A [S, d_in, r]``, ``B [S, r, d_out]``, under the
same dotted keys as `Adapters` (`stack_adapters` builds them from S single adapters).
A slot is given per batch row (``slots [B]``: the trainer, the engine's decode) or per
token (``slots [B, T]``: the engine's packed prefill, whose one row holds the prompts of
several requests end to end).

The model code is not forked: `with_adapters` swaps each targeted Linear of a model for a
`MultiLoraLinear` that wraps it (the same kernel arrays, not copies); `multi_lora_model`
merges the base model from its split state first. The swap happens while tracing, once
per compiled program. The trainer (`rl_core.training.multi_trainer`) and the rollout
engine (`rl_core.rollout.steps`) both run their models this way, which is why this lives
below both.

The grouped product ``(x A[s]) B[s]`` has two implementations (``impl``):

- ``"gather"``: gather each row's ``A[s]`` and ``B[s]`` and einsum per row; its cost is
  a ``[B, d_in, r]`` gather, small while r is small (per token: ``[B, T, d_in, r]``).
- ``"ragged"``: sort the tokens by slot and run `jax.lax.ragged_dot` over the groups
  (SkyRL's design); no per-row copy of the adapters, but a sort and a scatter back.

`bench/ml1_grouped_lora.py` measures both (bench/README.md, "Many adapters on one base
(ML1)"): on CPU gather was 1.4-2x faster at every shape tried, so it is `DEFAULT_IMPL`
(not measured on an accelerator, where ragged_dot may lower to a grouped kernel).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from rl_core.models.lora import Adapters, LoraConfig, init_adapters

# path -> {"a": [S, d_in, r], "b": [S, r, d_out]}: adapter s is slot s of every leaf.
StackedAdapters = dict[str, dict[str, jax.Array]]
Impl = Literal["gather", "ragged"]
IMPLS: tuple[Impl, ...] = ("gather", "ragged")
DEFAULT_IMPL: Impl = "gather"


def stack_adapters(adapters: Sequence[Adapters]) -> StackedAdapters:
    """S single adapters (same keys and shapes) as one stacked set, adapter s in slot s."""
    if not adapters:
        raise ValueError("stack_adapters needs at least one adapter")
    return jax.tree.map(lambda *xs: jnp.stack(xs), *adapters)  # type: ignore[no-any-return]


def slot_adapters(stacked: StackedAdapters, slot: int) -> Adapters:
    """Slot ``slot``'s adapter alone, in `lora`'s layout (to merge, export or compare)."""
    return jax.tree.map(lambda x: x[slot], stacked)  # type: ignore[no-any-return]


def init_stacked(params: Any, config: LoraConfig, key: jax.Array, slots: int) -> StackedAdapters:
    """``slots`` fresh adapters (B = 0), slot s drawn as `init_adapters` with key fold_in(s)."""
    return stack_adapters(
        [init_adapters(params, config, jax.random.fold_in(key, s)) for s in range(slots)]
    )


def zero_stacked(params: Any, config: LoraConfig, slots: int) -> StackedAdapters:
    """``slots`` adapters that change nothing (A = B = 0): room to `set_slot` adapters into."""
    one = init_adapters(params, config, jax.random.key(0))  # for the keys, shapes and dtypes
    return jax.tree.map(lambda x: jnp.zeros((slots, *x.shape), x.dtype), one)  # type: ignore[no-any-return]


@jax.jit
def set_slot(stacked: StackedAdapters, slot: jax.Array, one: Adapters) -> StackedAdapters:
    """``stacked`` with ``one`` in slot ``slot`` (traced: one program for every slot)."""
    return jax.tree.map(lambda s, x: s.at[slot].set(x.astype(s.dtype)), stacked, one)  # type: ignore[no-any-return]


def delta_gather(
    x: jax.Array,  # [B, T, d_in]
    a: jax.Array,  # [S, d_in, r]
    b: jax.Array,  # [S, r, d_out]
    slots: jax.Array,  # [B] or [B, T] int32
) -> jax.Array:  # [B, T, d_out] float32
    """(x A[s]) B[s] per row (or per token), by gathering each row's (token's) adapter."""
    if slots.ndim == 2:
        a_tok = a[slots].astype(jnp.float32)  # [B, T, d_in, r]
        b_tok = b[slots].astype(jnp.float32)  # [B, T, r, d_out]
        h = jnp.einsum("btd,btdr->btr", x.astype(jnp.float32), a_tok)
        return jnp.einsum("btr,btro->bto", h, b_tok)
    a_rows = a[slots].astype(jnp.float32)  # [B, d_in, r]
    b_rows = b[slots].astype(jnp.float32)  # [B, r, d_out]
    h = jnp.einsum("btd,bdr->btr", x.astype(jnp.float32), a_rows)
    return jnp.einsum("btr,bro->bto", h, b_rows)


def delta_ragged(
    x: jax.Array,  # [B, T, d_in]
    a: jax.Array,  # [S, d_in, r]
    b: jax.Array,  # [S, r, d_out]
    slots: jax.Array,  # [B] or [B, T] int32
) -> jax.Array:  # [B, T, d_out] float32
    """(x A[s]) B[s] per row (or token), over tokens sorted by slot through
    `jax.lax.ragged_dot`."""
    bsz, t, d_in = x.shape
    n_slots = a.shape[0]
    # [N]: a row's tokens share its slot, unless each token has its own.
    token_slot = slots.reshape(-1) if slots.ndim == 2 else jnp.repeat(slots, t)
    order = jnp.argsort(token_slot, stable=True)  # [N]: tokens grouped by slot, ascending
    sizes = jnp.bincount(token_slot, length=n_slots).astype(jnp.int32)  # [S]
    xs = x.reshape(bsz * t, d_in)[order].astype(jnp.float32)  # [N, d_in]
    f32 = jnp.float32
    h = jax.lax.ragged_dot(xs, a.astype(f32), sizes, preferred_element_type=f32)  # [N, r]
    ys = jax.lax.ragged_dot(h, b.astype(f32), sizes, preferred_element_type=f32)  # [N, d_out]
    y = jnp.zeros_like(ys).at[order].set(ys)  # back to row-major token order
    return y.reshape(bsz, t, -1)


_DELTAS = {"gather": delta_gather, "ragged": delta_ragged}


class MultiLoraLinear(nnx.Module):
    """A base `nnx.Linear` (held, not copied) plus its per-row low-rank delta."""

    def __init__(
        self,
        base: nnx.Linear,
        a: jax.Array,  # [S, d_in, r]
        b: jax.Array,  # [S, r, d_out]
        slots: jax.Array,  # [B] or [B, T]
        *,
        scale: float,
        impl: Impl,
    ) -> None:
        self.base = base
        # Plain data, not Params: this module lives only inside one traced call and is
        # never split, so the arrays need no Variable wrapping to be tracked.
        self.a, self.b, self.slots = nnx.data(a), nnx.data(b), nnx.data(slots)
        self.scale, self.impl = scale, impl

    def __call__(self, x: jax.Array) -> jax.Array:  # [B, T, d_in] -> [B, T, d_out]
        y = self.base(x)
        delta = _DELTAS[self.impl](x, self.a, self.b, self.slots)
        return (y.astype(jnp.float32) + self.scale * delta).astype(y.dtype)


def _dotted(path: Sequence[Any]) -> str:
    return ".".join(str(p) for p in path)


def _parent(root: nnx.Module, path: Sequence[Any]) -> Any:
    node: Any = root
    for p in path[:-1]:
        node = node[p] if isinstance(p, int) else getattr(node, str(p))
    return node


def wrap_linears(
    model: nnx.Module, names: set[str], wrap: Callable[[str, nnx.Linear], nnx.Module]
) -> None:
    """Replace, in place, each `nnx.Linear` of ``model`` whose dotted path is in ``names``
    by ``wrap(path, linear)``; every name must match a Linear."""
    found = [
        (path, node)
        for path, node in nnx.iter_graph(model)
        if isinstance(node, nnx.Linear) and _dotted(path) in names
    ]
    if len(found) != len(names):
        missing = sorted(names - {_dotted(p) for p, _ in found})
        raise ValueError(f"adapters name no Linear of the model: {missing}")
    for path, linear in found:
        setattr(_parent(model, path), str(path[-1]), wrap(_dotted(path), linear))


def multi_lora_model(
    graphdef: Any,
    base: Any,  # nnx.State of the base's Params
    rest: Any,  # the rest of the base's state
    stacked: StackedAdapters,
    slots: jax.Array,  # [B] int32: the adapter slot of each batch row
    config: LoraConfig,
    *,
    impl: Impl = DEFAULT_IMPL,
) -> Any:  # the base's own class (a `Model`), wrapped
    """The base model with every adapted Linear wrapped: call it as the base model on a
    batch whose row i uses slot ``slots[i]``. Meant for inside a jitted function (the
    wrapping is Python, done once per trace); ``base`` is used as is, never copied."""
    return with_adapters(nnx.merge(graphdef, base, rest), stacked, slots, config, impl=impl)


def with_adapters(
    model: Any,  # a `Model`, merged inside the traced function
    stacked: StackedAdapters,
    slots: jax.Array,  # [B] int32 per batch row, or [B, T] per token
    config: LoraConfig,
    *,
    impl: Impl = DEFAULT_IMPL,
) -> Any:  # ``model``, its adapted Linears wrapped in place
    """``model`` with each Linear that ``stacked`` names wrapped in a `MultiLoraLinear`."""
    if impl not in _DELTAS:
        raise ValueError(f"impl {impl!r}: use one of {IMPLS}")

    def wrap(name: str, linear: nnx.Linear) -> nnx.Module:
        ad = stacked[name]
        return MultiLoraLinear(linear, ad["a"], ad["b"], slots, scale=config.scale, impl=impl)

    wrap_linears(model, set(stacked), wrap)
    return model
