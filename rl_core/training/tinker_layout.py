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
    length = max(h["tokens"].shape[1] for h in hosts)
    rows = sum(h["tokens"].shape[0] for h in hosts)
    total = 1 << (rows - 1).bit_length()
    arrays = {name: np.zeros((total, length), hosts[0][name].dtype) for name in hosts[0]}
    row_slots = np.zeros(total, np.int32)
    call_rows: list[list[int]] = []
    places: list[list[Place]] = []
    row = 0
    for host, slot in zip(hosts, slots, strict=True):
        n, t = host["tokens"].shape
        for name, x in host.items():
            arrays[name][row : row + n, :t] = x
        row_slots[row : row + n] = slot
        call_rows.append(list(range(row, row + n)))
        places.append([(row + i, 0, int(host["mask"][i].sum())) for i in range(n)])
        row += n
    return _layout(arrays, row_slots, call_rows, places)


def packed(hosts: Sequence[dict[str, np.ndarray]], slots: Sequence[int]) -> Layout:
    """Each call's datums in bins of the longest bucket, one segment a datum."""
    length = max(h["tokens"].shape[1] for h in hosts)
    per_call = []
    for host in hosts:
        lengths = host["mask"].sum(axis=1).astype(np.int64)  # a datum's tokens: its mask
        per_call.append((lengths, first_fit_decreasing(range(len(lengths)), lengths, length)))
    used = sum(len(bins) for _, bins in per_call)
    plain_rows = 1 << (sum(h["tokens"].shape[0] for h in hosts) - 1).bit_length()
    total = bin_count(used, 1, max(plain_rows, used))
    arrays = {name: np.zeros((total, length), hosts[0][name].dtype) for name in hosts[0]}
    arrays["positions"] = np.zeros((total, length), np.int32)
    arrays["segments"] = np.full((total, length), -1, np.int32)
    row_slots = np.zeros(total, np.int32)
    call_rows: list[list[int]] = []
    places: list[list[Place]] = []
    row = 0
    for host, slot, (lengths, bins) in zip(hosts, slots, per_call, strict=True):
        where: list[Place] = [(0, 0, 0)] * len(lengths)
        for datums in bins:
            start = 0
            for segment, i in enumerate(datums):
                n = int(lengths[i])
                for name, x in host.items():
                    arrays[name][row, start : start + n] = x[i, :n]
                arrays["positions"][row, start : start + n] = np.arange(n)
                arrays["segments"][row, start : start + n] = segment
                where[i] = (row, start, n)
                start += n
            row_slots[row] = slot
            row += 1
        call_rows.append(list(range(row - len(bins), row)))
        places.append(where)
    return _layout(arrays, row_slots, call_rows, places)


def _layout(
    arrays: dict[str, np.ndarray],
    slots: np.ndarray,
    rows: list[list[int]],
    places: list[list[Place]],
) -> Layout:
    batch = {k: jnp.asarray(v) for k, v in arrays.items()}
    return Layout(batch, jnp.asarray(slots), rows, places)


__all__ = ["Layout", "Place", "packed", "plain"]
