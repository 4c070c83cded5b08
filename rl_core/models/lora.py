"""LoRA adapters (Hu et al., 2021) over a model's frozen weights, as pure functions.

A targeted kernel ``W [d_in, d_out]`` gets a low-rank update::

    W' = W + (alpha / r) * A @ B        A [d_in, r] ~ N(0, 1/d_in), B [r, d_out] = 0

so training starts from the base model exactly (B = 0) and only A and B are
trained. Adapters live outside the model, in a dict keyed by the module's
dotted path (``"blocks.0.attn.q"``); `merged_params` merges them into the
base weights (one small matmul per target), in the base model's own
structure, for a rollout engine that serves one policy and for export;
`multi_lora` applies many of them unmerged on one base instead (the Tinker
trainer, and an engine with adapter slots).

Targets are module names: ``q k v o`` (attention) and ``gate up down`` (MLP).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from rl_core.errors import UnsupportedSpec

Adapters = dict[str, dict[str, jax.Array]]  # path -> {"a": [d_in, r], "b": [r, d_out]}

KNOWN_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraConfig:
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q", "k", "v", "o")

    def __post_init__(self) -> None:
        unknown = sorted(set(self.targets) - set(KNOWN_TARGETS))
        if unknown or not self.targets:
            raise UnsupportedSpec(
                "model.lora.targets",
                f"unknown LoRA targets {unknown or '(none given)'}; use some of {KNOWN_TARGETS}",
            )

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def _key_name(entry: Any) -> str:
    # DictKey(key=...) for dicts and nnx.State, GetAttrKey(name=...) for a Variable's value.
    return str(getattr(entry, "key", getattr(entry, "name", entry)))


def _target_of(path: Sequence[Any], targets: tuple[str, ...]) -> str | None:
    """The adapter key of a kernel leaf's path, or None if the leaf is not targeted."""
    names = [_key_name(p) for p in path]
    if names and names[-1] == "value":  # a Variable's payload
        names = names[:-1]
    if len(names) >= 2 and names[-1] == "kernel" and names[-2] in targets:
        return ".".join(names[:-1])
    return None


def targeted_kernels(params: Any, targets: tuple[str, ...]) -> dict[str, jax.Array]:
    """Every kernel of ``params`` that a LoRA over ``targets`` adapts, by adapter key."""
    found: dict[str, jax.Array] = {}

    def visit(path: Sequence[Any], leaf: jax.Array) -> jax.Array:
        name = _target_of(path, targets)
        if name is not None:
            found[name] = leaf
        return leaf

    jax.tree_util.tree_map_with_path(visit, params)
    return found


def init_adapters(params: Any, config: LoraConfig, key: jax.Array) -> Adapters:
    """Fresh adapters for every targeted kernel of ``params`` (B = 0: no change yet)."""
    found = list(targeted_kernels(params, config.targets).items())
    if not found:
        raise UnsupportedSpec(
            "model.lora.targets",
            f"no kernel of the model matches {config.targets}; use some of {KNOWN_TARGETS}",
        )
    adapters: Adapters = {}
    for i, (name, kernel) in enumerate(sorted(found, key=lambda item: item[0])):
        if kernel.ndim != 2:
            raise UnsupportedSpec(
                "model.lora.targets", f"{name} has a {kernel.ndim}-d kernel; LoRA needs 2-d"
            )
        d_in, d_out = kernel.shape
        a = jax.random.normal(jax.random.fold_in(key, i), (d_in, config.rank), jnp.float32)
        adapters[name] = {
            "a": (a / jnp.sqrt(d_in)).astype(kernel.dtype),
            "b": jnp.zeros((config.rank, d_out), kernel.dtype),
        }
    return adapters


def merged_params(params: Any, adapters: Adapters, config: LoraConfig) -> Any:
    """``params`` with ``W + scale * A @ B`` on every adapted kernel; same structure as ``params``.

    Pure and jit-friendly. This is what the rollout engine serves and what an
    exporter writes: the merged weights of the base architecture.
    """

    def merge(path: Sequence[Any], leaf: jax.Array) -> jax.Array:
        name = _target_of(path, config.targets)
        if name is None or name not in adapters:
            return leaf
        ad = adapters[name]
        delta = (ad["a"].astype(jnp.float32) @ ad["b"].astype(jnp.float32)) * config.scale
        return (leaf.astype(jnp.float32) + delta).astype(leaf.dtype)

    return jax.tree_util.tree_map_with_path(merge, params)


def count_adapter_params(adapters: Adapters) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(adapters))
