"""Tinker's training primitives for S adapters on one base, several models per program.

`primitives.LoraModel` trains one adapter: a forward_backward call of each model runs
alone. Here S slots share the base: one `forward_backward` takes the pending calls of
several slots (one loss function), runs them as one batch whose rows each use their
slot's adapter (`multi_lora.multi_lora_model`), and adds each slot's gradient to that
slot's accumulator only. The summed loss's gradient is exactly each slot's own: slots'
adapters are disjoint parameters, so a slot's rows contribute nothing to the others
(and a slot without rows gets a zero gradient). `optim_step(slot, AdamParams)` applies
Adam to one slot with that call's hyperparameters and clears its accumulator.

A call's datums are laid end to end in rows of the batch's length bucket
(`tinker_layout.packed`; ``pack=False``: one a row, padded) and the output head runs a
chunk of positions at a time (`chunked_logits`; ``logits_chunk=None``: every position's
logits at once): the logprobs, losses and gradients of the plain, full-logits path
(tests/rl_core/training/test_multi_trainer.py).

All state is stacked by slot ([S, ...] leaves): adapters, gradient accumulators, Adam
moments; a slot's step count is a host integer. `export_slot` copies one slot's adapter,
moments and step count to the host and `import_slot` puts them back into any slot of a
trainer of the same base and LoRA config (Tinker's save_state / load_state; the bytes
in the artifact store are `slot_state`'s).
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
from rl_core.training import tinker_layout
from rl_core.training.chunked_logits import LOGITS_CHUNK, chunked_target_logprobs
from rl_core.training.lora import LoraConfig, init_adapters, merged_params
from rl_core.training.multi_lora import (
    DEFAULT_IMPL,
    Impl,
    StackedAdapters,
    multi_lora_model,
    slot_adapters,
)
from rl_core.training.primitives import (
    AdamParams,
    Datum,
    adam_update,
    host_batch,
    per_token_loss,
    token_loss,
)


@dataclasses.dataclass(frozen=True)
class SlotCall:
    """One model's pending forward_backward: its slot, its datums and its loss_fn_config
    (calls with different configs share a batch: the values are per-row arrays)."""

    slot: int
    data: Sequence[Datum]
    config: Mapping[str, float | str] | None = None


@dataclasses.dataclass(frozen=True)
class SlotResult:
    logprobs: list[list[float]]  # each datum's target logprobs
    loss: float  # this call's summed loss


def _multi_loss(
    stacked: StackedAdapters,
    base: Any,
    rest: Any,
    batch: dict[str, jax.Array],
    slots: jax.Array,  # [B] int32
    *,
    graphdef: Any,
    lora: LoraConfig,
    loss_fn: str,
    impl: Impl,
    logits_chunk: int | None,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:  # summed loss, (per-row loss [B], lp [B, T])
    model = multi_lora_model(graphdef, base, rest, stacked, slots, lora, impl=impl)
    tokens = batch["tokens"]
    if "segments" in batch:  # packed rows (`tinker_layout.packed`)
        h, _ = model.hidden(tokens, batch["positions"], segments=batch["segments"])
    else:
        h, _ = model.hidden(tokens, jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape))
    if logits_chunk is None:  # every position's [V] logits at once: the reference path
        per_token, lp = token_loss(model.logits(h), batch, loss_fn)
    else:
        lp = chunked_target_logprobs(h, batch["target_tokens"], model.logits, logits_chunk)
        per_token, lp = per_token_loss(lp, batch, loss_fn)
    per_row = jnp.sum(per_token, axis=1)
    return jnp.sum(per_row), (per_row, lp)


@functools.cache
def _compiled(
    graphdef: Any,
    lora: LoraConfig,
    loss_fn: str,
    impl: Impl,
    forward_only: bool,
    logits_chunk: int | None,
) -> Any:
    loss = functools.partial(
        _multi_loss,
        graphdef=graphdef,
        lora=lora,
        loss_fn=loss_fn,
        impl=impl,
        logits_chunk=logits_chunk,
    )
    if forward_only:
        return jax.jit(loss)
    return jax.jit(jax.value_and_grad(loss, has_aux=True))


@jax.jit
def _add(acc: StackedAdapters, grads: StackedAdapters) -> StackedAdapters:
    return jax.tree.map(jnp.add, acc, grads)  # type: ignore[no-any-return]


@jax.jit
def _adam_slot(
    w: StackedAdapters,
    m: StackedAdapters,
    v: StackedAdapters,
    g: StackedAdapters,
    slot: jax.Array,  # int32 scalar, traced: one program for every slot
    t: jax.Array,
    hyper: jax.Array,  # [6] lr, beta1, beta2, eps, weight_decay, grad_clip_norm
) -> tuple[StackedAdapters, StackedAdapters, StackedAdapters, StackedAdapters, jax.Array]:
    """`primitives.adam_update` on slot ``slot`` only (its grad norm and clipping are its own);
    its accumulator is cleared, every other slot is left as it was."""
    take = functools.partial(jax.tree.map, lambda x: x[slot])
    w1, m1, v1, norm = adam_update(take(w), take(m), take(v), take(g), t, *hyper)

    def put(stacked: StackedAdapters, one: Any) -> StackedAdapters:
        return jax.tree.map(lambda s, x: s.at[slot].set(x), stacked, one)  # type: ignore[no-any-return]

    g0 = jax.tree.map(lambda s: s.at[slot].set(0), g)
    return put(w, w1), put(m, m1), put(v, v1), g0, norm


@jax.jit
def _set_slot(stacked: StackedAdapters, slot: jax.Array, one: Any) -> StackedAdapters:
    return jax.tree.map(lambda s, x: s.at[slot].set(x), stacked, one)  # type: ignore[no-any-return]


# path -> {"a": [d_in, r], "b": [r, d_out]} as numpy arrays: one slot's, off the device.
HostAdapters = dict[str, dict[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class SlotState:
    """One slot's training state (`MultiLoraTrainer.export_slot`): the adapter, Adam's
    first and second moments (same layout) and the number of steps taken."""

    adapter: HostAdapters
    m: HostAdapters
    v: HostAdapters
    step: int


def _check_fits(given: HostAdapters, expected: Any) -> None:
    """``given`` has ``expected``'s keys, shapes and dtypes, or `UnsupportedSpec` naming
    the first that differs (state saved on another base or at another rank)."""
    if sorted(given) != sorted(expected):
        raise UnsupportedSpec(
            "lora.targets",
            f"the saved state adapts {sorted(given)}, this model {sorted(expected)}",
        )
    for name, pair in expected.items():
        for part, x in pair.items():
            got = given[name].get(part)
            if got is None or tuple(got.shape) != tuple(x.shape) or got.dtype != x.dtype:
                have = "nothing" if got is None else f"{got.dtype}{list(got.shape)}"
                raise UnsupportedSpec(
                    "lora.rank",
                    f"the saved state's {name}.{part} is {have}, this model's is "
                    f"{x.dtype}{list(x.shape)} (another base or LoRA rank)",
                )


class MultiLoraTrainer:
    """S adapter slots on a base `Model` (never changed), each with its own gradient
    accumulator, Adam moments and step count. A slot holds one Tinker model; `reset`
    gives a slot a fresh adapter (as `LoraModel(model, seed=...)` would start)."""

    def __init__(
        self,
        model: Model,
        *,
        slots: int,
        lora: LoraConfig,
        impl: Impl = DEFAULT_IMPL,
        pack: bool = True,
        logits_chunk: int | None = LOGITS_CHUNK,
    ) -> None:
        """``pack``: each call's datums laid end to end in rows (`tinker_layout.packed`),
        else one a row, padded. ``logits_chunk``: positions per chunk of the output head
        (`chunked_logits`); None: every position's logits at once."""
        if slots < 1:
            raise UnsupportedSpec("slots", f"need at least one adapter slot, got {slots}")
        if logits_chunk is not None and logits_chunk < 1:
            raise UnsupportedSpec("logits_chunk", f"must be >= 1 position, got {logits_chunk}")
        self.lora, self.impl, self.n_slots = lora, impl, slots
        self.pack, self.logits_chunk = pack, logits_chunk
        self.max_len: int = model.config.max_seq_len
        graphdef, base, rest = nnx.split(model, nnx.Param, ...)  # type: ignore[misc]
        self._graphdef, self._base, self._rest = graphdef, base, rest
        one = init_adapters(base, lora, jax.random.key(0))
        zeros = jax.tree.map(lambda x: jnp.zeros((slots, *x.shape), x.dtype), one)
        self.adapters: StackedAdapters = zeros
        self.grads: StackedAdapters = zeros
        self.m: StackedAdapters = zeros
        self.v: StackedAdapters = zeros
        self.steps = [0] * slots
        self.used = 0  # slots 0..used-1 are handed out by `add`
        self.released: list[int] = []  # of those, the ones `remove` gave back
        self._merge = jax.jit(functools.partial(merged_params, config=lora))

    def add(self, seed: int) -> int:
        """A fresh adapter in the next free slot, its index; when every slot is taken, the
        slots double first (the programs compile again for the new S, so not one by one).
        A slot `remove` gave back is taken before a new one."""
        if self.released:
            slot = self.released.pop()
            self.reset(slot, seed)
            return slot
        if self.used == self.n_slots:
            grow = functools.partial(
                jax.tree.map, lambda x: jnp.concatenate([x, jnp.zeros_like(x)])
            )
            self.adapters, self.grads = grow(self.adapters), grow(self.grads)
            self.m, self.v = grow(self.m), grow(self.v)
            self.steps += [0] * self.n_slots
            self.n_slots *= 2
        slot, self.used = self.used, self.used + 1
        self.reset(slot, seed)
        return slot

    def remove(self, slot: int) -> None:
        """Give ``slot`` back (its model was unloaded): zeroed, so no gradient or update
        of it can reach a later model, and handed out again by the next `add`."""
        self._check(slot)
        if slot in self.released:
            return
        self._fill(slot, jax.tree.map(jnp.zeros_like, slot_adapters(self.adapters, slot)))
        self.released.append(slot)

    def reset(self, slot: int, seed: int) -> None:
        """A fresh adapter in ``slot`` (B = 0), with no gradient, moments or steps."""
        self._check(slot)
        self._fill(slot, init_adapters(self._base, self.lora, jax.random.key(seed)))

    def _fill(self, slot: int, adapter: Any) -> None:
        """``adapter`` in ``slot``, its gradient, moments and step count zero."""
        zero = jax.tree.map(jnp.zeros_like, adapter)
        index = jnp.int32(slot)
        self.adapters = _set_slot(self.adapters, index, adapter)
        self.grads = _set_slot(self.grads, index, zero)
        self.m = _set_slot(self.m, index, zero)
        self.v = _set_slot(self.v, index, zero)
        self.steps[slot] = 0

    def adapter(self, slot: int) -> Any:
        """Slot ``slot``'s adapter in `lora.py`'s layout (to merge for sampling or export)."""
        self._check(slot)
        return slot_adapters(self.adapters, slot)

    def export_slot(self, slot: int) -> SlotState:
        """Slot ``slot``'s training state on the host (copies): its adapter, Adam moments
        and step count, what `import_slot` puts back exactly. The gradient accumulator is
        left out: it belongs to calls not yet stepped, on these weights only."""
        self._check(slot)

        def host(stacked: StackedAdapters) -> HostAdapters:
            return {
                name: {part: np.array(x[slot]) for part, x in pair.items()}
                for name, pair in stacked.items()
            }

        return SlotState(host(self.adapters), host(self.m), host(self.v), self.steps[slot])

    def import_slot(self, slot: int, state: SlotState, *, optimizer: bool) -> None:
        """Slot ``slot`` takes ``state``'s adapter, and its Adam moments and step count when
        ``optimizer`` (else they start again from zero, as a fresh model's). Its gradient
        accumulator is cleared. A state of other targets or shapes (another base or rank)
        is refused, naming the first key that differs."""
        self._check(slot)
        index = jnp.int32(slot)
        expected = slot_adapters(self.adapters, 0)
        parts = [state.adapter, state.m, state.v] if optimizer else [state.adapter]
        for part in parts:
            _check_fits(part, expected)
        one = functools.partial(jax.tree.map, jnp.asarray)
        self._fill(slot, one(state.adapter))
        if optimizer:
            self.m = _set_slot(self.m, index, one(state.m))
            self.v = _set_slot(self.v, index, one(state.v))
            self.steps[slot] = state.step

    def sampler_weights(self, slot: int) -> Any:
        """Slot ``slot``'s adapter merged into the base, as `nnx.state(model)` (what a
        `JaxEngine` samples with): a copy, as `LoraModel.sampler_weights`."""
        self._check(slot)
        merged = self._merge(self._base, slot_adapters(self.adapters, slot))
        return nnx.merge_state(merged, self._rest)

    def forward_backward(
        self, calls: Sequence[SlotCall], loss_fn: str, *, forward_only: bool = False
    ) -> list[SlotResult]:
        """Several slots' calls as one batch: each call's logprobs and summed loss, in order;
        unless ``forward_only``, each slot's gradient joins its own accumulator."""
        if not calls:
            raise UnsupportedSpec("calls", "forward_backward needs at least one call")
        for call in calls:
            self._check(call.slot)
        # Each call checked alone, so a refusal names data[i] as that call's client sent it.
        hosts = [host_batch(c.data, loss_fn, self.max_len, c.config) for c in calls]
        lay = (tinker_layout.packed if self.pack else tinker_layout.plain)(
            hosts, [c.slot for c in calls]
        )
        fn = _compiled(
            self._graphdef, self.lora, loss_fn, self.impl, forward_only, self.logits_chunk
        )
        args = (self.adapters, self._base, self._rest, lay.batch, lay.slots)
        if forward_only:
            _, (per_row, lp) = fn(*args)
        else:
            (_, (per_row, lp)), grads = fn(*args)
            self.grads = _add(self.grads, grads)
        per_row_np, lp_np = np.asarray(per_row), np.asarray(lp)
        return [
            SlotResult(
                [lp_np[row, start : start + n].tolist() for row, start, n in places],
                float(per_row_np[rows].sum()),
            )
            for rows, places in zip(lay.rows, lay.places, strict=True)
        ]

    def optim_step(self, slot: int, p: AdamParams) -> dict[str, float]:
        """Adam on ``slot``'s accumulated gradient with this call's hyperparameters."""
        self._check(slot)
        self.steps[slot] += 1
        hyper = jnp.asarray(
            [p.learning_rate, p.beta1, p.beta2, p.eps, p.weight_decay, p.grad_clip_norm],
            jnp.float32,
        )
        self.adapters, self.m, self.v, self.grads, norm = _adam_slot(
            self.adapters,
            self.m,
            self.v,
            self.grads,
            jnp.int32(slot),
            jnp.float32(self.steps[slot]),
            hyper,
        )
        return {"grad_norm": float(norm), "step": float(self.steps[slot])}

    def _check(self, slot: int) -> None:
        if not 0 <= slot < self.n_slots:
            raise UnsupportedSpec("slot", f"slot {slot} is not one of 0..{self.n_slots - 1}")
