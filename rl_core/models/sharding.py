"""Sharding of the decoder over a device mesh with ``data``, ``fsdp`` and ``tensor`` axes.

- ``data``: batch rows split across replicas of the whole model;
- ``fsdp``: batch rows split too, and every weight matrix split along its model dimension
  (ZeRO-3 style: XLA all-gathers a weight where it is used);
- ``tensor``: Megatron-style: attention heads and MLP hidden units split, so q/k/v, gate
  and up are column-parallel and o and down row-parallel; the untied head's vocabulary
  and the embedding's model dimension are split too.

Parameters get their `PartitionSpec` from one rule table keyed by the parameter's path in
the NNX model (`param_specs`), so a loaded checkpoint needs no annotations of its own; an
axis that does not divide a dimension is dropped for that parameter (replicated instead)
rather than failing. Activations are constrained inside the model (`constrain`) to rows
over ``("data", "fsdp")``; outside a mesh that is a no-op, so the same model code runs
unsharded on one CPU and sharded on many chips.

::

    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    shard_model(model, mesh)
    with jax.set_mesh(mesh):
        logits, _ = jitted_forward(model, tokens)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXES = ("data", "fsdp", "tensor")
ROWS = ("data", "fsdp")  # the axes a batch's rows are split over


def P(*axes: str | tuple[str, ...] | None) -> PartitionSpec:
    """`PartitionSpec`, typed (jax leaves its constructor unannotated)."""
    return PartitionSpec(*axes)  # type: ignore[no-untyped-call]


# (last path elements of a parameter) -> spec of its array, in nnx layouts ([in, out]).
_RULES: dict[tuple[str, ...], PartitionSpec] = {
    # [V, D]: split along D, not V: a gather from a vocabulary-split table makes XLA
    # replicate it (SPMD "involuntary full rematerialization").
    ("embed", "embedding"): P(None, "tensor"),
    ("q", "kernel"): P("fsdp", "tensor"),  # [D, H*hd]: heads split
    ("k", "kernel"): P("fsdp", "tensor"),
    ("v", "kernel"): P("fsdp", "tensor"),
    ("q", "bias"): P("tensor"),
    ("k", "bias"): P("tensor"),
    ("v", "bias"): P("tensor"),
    ("o", "kernel"): P("tensor", "fsdp"),  # [H*hd, D]: row-parallel
    ("gate", "kernel"): P("fsdp", "tensor"),  # [D, F]
    ("up", "kernel"): P("fsdp", "tensor"),
    ("down", "kernel"): P("tensor", "fsdp"),  # [F, D]
    ("lm_head", "kernel"): P("fsdp", "tensor"),  # [D, V]
    ("scale",): P(),  # norms: small, replicated
}


def make_mesh(
    *, data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[Any] | None = None
) -> Mesh:
    """A ``data x fsdp x tensor`` mesh over ``devices`` (default: all of them, in order)."""
    devices = list(jax.devices() if devices is None else devices)
    if data * fsdp * tensor != len(devices):
        raise ValueError(
            f"mesh data={data} x fsdp={fsdp} x tensor={tensor} needs "
            f"{data * fsdp * tensor} devices, {len(devices)} are available"
        )
    return Mesh(np.asarray(devices).reshape(data, fsdp, tensor), AXES)


def spec_for(path: Sequence[Any], shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """The spec of one parameter: the rule for its path, minus axes that do not divide it."""
    names = tuple(str(p) for p in path)
    rule = next((r for k, r in _RULES.items() if names[-len(k) :] == k), P())
    fitted = []
    for dim, axis in zip(shape, tuple(rule) + (None,) * (len(shape) - len(rule)), strict=True):
        fitted.append(axis if axis is not None and dim % mesh.shape[axis] == 0 else None)
    return P(*fitted)


def param_specs(model: nnx.Module, mesh: Mesh) -> Any:
    """An `nnx.State` of `PartitionSpec`, shaped like ``nnx.state(model)``."""
    state = nnx.state(model)
    return nnx.from_flat_state(
        [
            (path, var.replace(spec_for(path, var.shape, mesh)))
            for path, var in nnx.to_flat_state(state)
        ]
    )


def shard_model(model: nnx.Module, mesh: Mesh) -> None:
    """Place every parameter of ``model`` on ``mesh`` by `param_specs` (in place)."""
    state = nnx.state(model)
    specs = param_specs(model, mesh)
    shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs)
    nnx.update(model, jax.device_put(state, shardings))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Rows over ``("data", "fsdp")``, other axes replicated: how to place a batch."""
    return NamedSharding(mesh, P(ROWS, *([None] * (ndim - 1))))


def constrain(x: jax.Array) -> jax.Array:  # [B, ...] -> [B, ...]
    """Keep an activation's rows split over ``("data", "fsdp")`` under a mesh; else unchanged."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(ROWS) <= set(mesh.axis_names):
        return x
    rows = int(np.prod([mesh.shape[a] for a in ROWS]))
    if x.shape[0] % rows:
        return x  # a batch that does not split evenly (one decode row) stays as XLA likes
    spec = P(ROWS, *([None] * (x.ndim - 1)))
    constrained: jax.Array = jax.lax.with_sharding_constraint(x, spec)  # type: ignore[no-untyped-call]
    return constrained
