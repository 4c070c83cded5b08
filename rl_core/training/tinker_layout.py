"""Several models' forward_backward calls laid out as one batch for `MultiLoraTrainer`.

Each call's datums arrive as `primitives.host_batch` arrays ([n, T], T the power-of-two
bucket of its longest datum), already checked. Two layouts of the same rows:

- ``plain``: one datum a row, every row padded to the longest bucket. A Tinker loop's
  datums vary (prompt plus a completion of any length), so most positions of a batch
  whose longest datum sets L are padding, and attention is quadratic in L.
- ``packed``: each call's datums laid end to end in bins of L tokens (first-fit
  decreasing, `packing.first_fit_decreasing`), one segment a datum: positions restart
  at 0 and a token attends only to its own datum's (`Model.hidden(..., segments=...)`),
  so every target's context is the one it has alone. A bin holds one call's datums
  only, so a row keeps one slot (one adapter) and a call's loss is the sum over its own
  rows. Losses that reduce over a datum (GSPO's sequence ratio) reduce over its segment
  (`losses.sequence_sums`).

Rows are padded (mask 0, slot 0) to a few counts so a few shapes compile: powers of two
for ``plain`` (as before packing), half octaves for ``packed`` (`packing.bin_count`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rl_core.training.packing import bin_count, first_fit_decreasing

Place = tuple[int, int, int]  # a datum's (row, first position, tokens) in the batch


@dataclasses.dataclass(frozen=True)
class Layout:
    batch: dict[str, jax.Array]  # [R, L] each; packed adds "positions" and "segments"
    slots: jax.Array  # [R] int32: each row's adapter slot
    rows: list[list[int]]  # per call: the rows that hold its datums
    places: list[list[Place]]  # per call, per datum


def plain(hosts: Sequence[dict[str, np.ndarray]], slots: Sequence[int]) -> Layout:
    """One datum a row, padded to the longest bucket; rows to a power of two."""
    bins = [[[i] for i in range(len(h["mask"]))] for h in hosts]
    datums = sum(len(h["mask"]) for h in hosts)
    return _fill(hosts, slots, bins, 1 << (datums - 1).bit_length(), segmented=False)


def packed(hosts: Sequence[dict[str, np.ndarray]], slots: Sequence[int]) -> Layout:
    """Each call's datums in bins of the longest bucket, one segment a datum."""
    length = max(h["tokens"].shape[1] for h in hosts)
    bins = [first_fit_decreasing(range(len(h["mask"])), _lengths(h), length) for h in hosts]
    datums = sum(len(h["mask"]) for h in hosts)
    used = sum(len(b) for b in bins)
    total = bin_count(used, 1, 1 << (datums - 1).bit_length())  # at most plain's rows
    return _fill(hosts, slots, bins, total, segmented=True)


def _lengths(host: dict[str, np.ndarray]) -> np.ndarray:  # [n] a datum's tokens: its mask
    lengths: np.ndarray = host["mask"].sum(axis=1).astype(np.int64)
    return lengths


def _fill(
    hosts: Sequence[dict[str, np.ndarray]],
    slots: Sequence[int],
    bins: list[list[list[int]]],  # per call, its rows: the datums each holds, in order
    total: int,  # rows, padding included
    *,
    segmented: bool,  # "positions" and "segments" for rows of several datums
) -> Layout:
    length = max(h["tokens"].shape[1] for h in hosts)
    arrays = {name: np.zeros((total, length), hosts[0][name].dtype) for name in hosts[0]}
    if segmented:
        arrays["positions"] = np.zeros((total, length), np.int32)
        arrays["segments"] = np.full((total, length), -1, np.int32)
    row_slots = np.zeros(total, np.int32)
    call_rows: list[list[int]] = []
    places: list[list[Place]] = []
    row = 0
    for host, slot, call_bins in zip(hosts, slots, bins, strict=True):
        lengths = _lengths(host)
        where: list[Place] = [(0, 0, 0)] * len(lengths)
        for datums in call_bins:
            start = 0
            for segment, i in enumerate(datums):
                n = int(lengths[i])
                for name, x in host.items():
                    arrays[name][row, start : start + n] = x[i, :n]
                if segmented:
                    arrays["positions"][row, start : start + n] = np.arange(n)
                    arrays["segments"][row, start : start + n] = segment
                where[i] = (row, start, n)
                start += n
            row_slots[row] = slot
            row += 1
        call_rows.append(list(range(row - len(call_bins), row)))
        places.append(where)
    batch = {k: jnp.asarray(v) for k, v in arrays.items()}
    return Layout(batch, jnp.asarray(row_slots), call_rows, places)


__all__ = ["Layout", "Place", "packed", "plain"]
