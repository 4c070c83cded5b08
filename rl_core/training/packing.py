"""Sequence packing: a mini-batch's rows laid end to end in bins, no padding to the longest.

A train batch pads every row to the bucket of its longest; with episodes of 1 to 32
turns, rows of 20 and of 450 tokens share one batch and most of a step's positions (and
more of its attention, quadratic in the length) are padding. Here the host lays a
mini-batch's rows into bins of the batch's length L by first-fit decreasing: each row cut
after its last trained token (what follows it changes no loss term: attention is causal),
rows that train on nothing left out. Inside a bin each row is a segment: its positions
restart at 0 and its tokens attend only to its own (`Model.hidden(..., segments=...)`),
so each trained token sees exactly the context it has in its own row, and the loss,
its counts and its metrics read the same numbers as the plain layout's, summed in
another order (tests/rl_core/training/test_packing.py).

The target of the last input position of one segment would be the next segment's first
token: no row trains on it (a row's first token is its prompt's, never a target), and
here it is never gathered: its mask, advantage and logprobs are 0 by construction.

Shapes stay few: a step's mini-batches share one bin count, the fullest's rounded up to
``multiple`` (the micro-batches) times a half-octave count (`bin_count`), at most the
plain path's rows, and one width of the head's index; the bin length is the batch's own.
A step whose packing saves less than ``min_saving`` of the plain path's positions is
not packed (`plan_step` returns None).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from rl_core.training import train_step as ts
from rl_core.training.head_positions import index_width, trained_positions


def row_lengths(mask: np.ndarray) -> np.ndarray:  # [B, T-1] loss mask -> [B] int
    """Tokens each row needs: through the target of its last trained position (0: none)."""
    trained = np.asarray(mask) > 0
    last = trained.shape[1] - 1 - trained[:, ::-1].argmax(axis=1)
    return np.where(trained.any(axis=1), last + 2, 0).astype(np.int64)


def first_fit_decreasing(
    rows: Sequence[int] | np.ndarray, lengths: np.ndarray, capacity: int
) -> list[list[int]]:  # bins of batch rows, each summing to <= capacity
    """Longest row first, each into the first bin it fits (a new one if none); rows of
    length 0 in no bin. Ties keep ``rows``' order, so a layout is a function of it."""
    order = sorted((int(r) for r in rows if lengths[r] > 0), key=lambda r: -int(lengths[r]))
    bins: list[list[int]] = []
    room: list[int] = []
    for r in order:
        need = int(lengths[r])
        if need > capacity:
            raise ValueError(f"row {r} needs {need} tokens, more than a bin's {capacity}")
        for i, free in enumerate(room):
            if need <= free:
                bins[i].append(r)
                room[i] -= need
                break
        else:
            bins.append([r])
            room.append(capacity - need)
    return bins


def bin_count(n: int, multiple: int, cap: int) -> int:
    """``n`` bins rounded up to ``multiple`` times a half-octave count (1, 2, 3, 4, 6, 8,
    12, 16, 24, ...), at most ``cap`` (a multiple of ``multiple``, at least ``n``: the
    plain path's rows). Half octaves, not quarters: each count is a compile (seconds),
    and a step of 0.5 s pays one back only after many steps."""
    per = -(-max(n, 1) // multiple)
    octave = 1 << (per - 1).bit_length()  # the power of two at or above
    half = octave * 3 // 4 if per > 2 and per <= octave * 3 // 4 else octave
    return min(multiple * half, cap)


@dataclasses.dataclass(frozen=True)
class Packing:
    """Where each packed token comes from. [P, L] arrays index the batch's [B, T] tokens;
    [P, L-1] ones its [B, T-1] per-target arrays (-1: padding, or a segment's first
    token, which no position of the bin predicts)."""

    rows: np.ndarray  # [P, L] int32: the batch row of each token; -1 padding
    cols: np.ndarray  # [P, L] int32: its column in that row (= its position)
    segments: np.ndarray  # [P, L] int32: the row's index in its bin; -1 padding
    target_rows: np.ndarray  # [P, L-1] int32: the row whose target each position is; -1
    target_cols: np.ndarray  # [P, L-1] int32: its column in the row's [T-1] arrays
    sequences: np.ndarray  # [P] float32: rows in each bin (each trains on something)

    @property
    def positions(self) -> np.ndarray:  # [P, L]: restart at 0 per segment (0: padding)
        return self.cols


def plan(
    rows: Sequence[int] | np.ndarray,  # the mini-batch's batch rows, in its order
    mask: np.ndarray,  # [B, T-1] the batch's loss mask
    *,
    multiple: int,
    min_saving: float,
    bins: int = 0,
) -> Packing | None:  # None: packing would save less than ``min_saving`` of the positions
    """The rows packed into bins of the batch's length T, ``multiple`` dividing their count
    (at least ``bins`` of them: `plan_step`)."""
    layouts = plan_step([rows], mask, multiple=multiple, min_saving=min_saving, bins=bins)
    return None if layouts is None else layouts[0]


def plan_step(
    parts: Sequence[Sequence[int] | np.ndarray],  # a step's mini-batches, equal row counts
    mask: np.ndarray,  # [B, T-1]
    *,
    multiple: int,
    min_saving: float,
    bins: int = 0,
) -> list[Packing] | None:  # one per part, all of one shape; None: too little saved
    """Each part packed, all into the bin count the fullest needs: one compiled shape a
    step. None (the plain path for the whole step) when that count saves less than
    ``min_saving`` of a part's positions. ``bins``: at least this many (empty ones
    padding), to run in a shape already compiled (`rl_core.training.shape_ledger`)."""
    length = mask.shape[1] + 1
    lengths = row_lengths(mask)
    laid = [first_fit_decreasing(rows, lengths, length) for rows in parts]
    size = len(parts[0])
    count = bin_count(max(len(b) for b in laid), multiple, size)
    if count > (1.0 - min_saving) * size:
        return None
    if bins > size or bins % multiple:
        raise ValueError(f"{bins} bins: at most {size}, a multiple of {multiple}")
    count = max(count, bins)
    return [_layout(b, lengths, count, length) for b in laid]


def _layout(bins: list[list[int]], lengths: np.ndarray, count: int, length: int) -> Packing:
    src_row = np.full((count, length), -1, np.int32)
    src_col = np.zeros((count, length), np.int32)
    segment = np.full((count, length), -1, np.int32)
    for i, members in enumerate(bins):
        at = 0
        for k, r in enumerate(members):
            n = int(lengths[r])
            src_row[i, at : at + n] = r
            src_col[i, at : at + n] = np.arange(n)
            segment[i, at : at + n] = k
            at += n
    # Position j predicts token j+1: the row's target at column (its column - 1), when
    # token j+1 continues a row (column >= 1); a segment's first token is no one's target.
    follows = (src_row[:, 1:] >= 0) & (src_col[:, 1:] >= 1)
    target_rows = np.where(follows, src_row[:, 1:], -1).astype(np.int32)
    target_cols = np.where(follows, src_col[:, 1:] - 1, 0).astype(np.int32)
    sequences = np.zeros((count,), np.float32)
    sequences[: len(bins)] = [len(b) for b in bins]
    return Packing(src_row, src_col, segment, target_rows, target_cols, sequences)


def head_width(layouts: Sequence[Packing], mask: np.ndarray) -> int:
    """One width of the head's index (`trained_positions`) for all ``layouts``: the
    widest any of their bins needs, so a step's packed updates share one program."""
    most = max(int((gather_targets(mask, p) > 0).sum(axis=1).max()) for p in layouts)
    return index_width(most, mask.shape[1])


def gather_targets(x: ArrayLike, p: Packing) -> np.ndarray:  # [B, T-1] -> [P, L-1]
    """A per-target array in the packed layout; 0 where no row's target is."""
    x = np.asarray(x)
    got = x[np.maximum(p.target_rows, 0), p.target_cols]
    return np.where(p.target_rows >= 0, got, 0).astype(x.dtype)


def scatter_targets(x: np.ndarray, p: Packing, rows: int) -> np.ndarray:  # -> [B, T-1]
    """``gather_targets``' inverse: a packed [P, L-1] array back in the row layout; 0 at
    the positions no bin holds (past a row's last trained token, rows left out)."""
    out = np.zeros((rows, x.shape[1]), np.float32)
    valid = p.target_rows >= 0
    out[p.target_rows[valid], p.target_cols[valid]] = x[valid]
    return out


def packed_tokens(tokens: np.ndarray, p: Packing) -> np.ndarray:  # [B, T] -> [P, L] int32
    got = tokens[np.maximum(p.rows, 0), p.cols]
    return np.where(p.rows >= 0, got, 0).astype(np.int32)


def mini_batch(
    host: ts.MiniBatch,  # the batch's rows on the host (numpy), pi_old / pi_ref included
    p: Packing,
    *,
    head_width: int | None,  # the head's index this wide (`head_width`); None: no index
    sequence_weights: bool,  # per-token 1 / its row's trained tokens (sequence_mean)
) -> ts.MiniBatch:
    """The packed mini-batch the jitted update takes; advantages per token (a row's one
    advantage on each of its targets)."""
    mask = gather_targets(host.mask, p)
    adv = np.asarray(host.advantages)
    if adv.ndim == 1:  # per row: broadcast to the row's targets
        adv = np.where(p.target_rows >= 0, adv[np.maximum(p.target_rows, 0)], 0.0)
    else:
        adv = gather_targets(adv, p)

    def maybe(x: ArrayLike | None) -> jax.Array | None:
        return None if x is None else jnp.asarray(gather_targets(x, p))

    weights = None
    if sequence_weights:
        trained = np.maximum((np.asarray(host.mask) > 0).sum(axis=1), 1)  # [B]
        per_row = 1.0 / trained[np.maximum(p.target_rows, 0)]
        weights = jnp.asarray(np.where(mask > 0, per_row, 0.0).astype(np.float32))
    return ts.MiniBatch(
        tokens=jnp.asarray(packed_tokens(np.asarray(host.tokens), p)),
        mask=jnp.asarray(mask),
        behaviour=jnp.asarray(gather_targets(np.asarray(host.behaviour), p)),
        lag=maybe(host.lag),
        advantages=jnp.asarray(adv.astype(np.float32)),
        old_logprobs=maybe(host.old_logprobs),
        ref_logprobs=maybe(host.ref_logprobs),
        old_values=None,
        returns=None,
        trained_at=None
        if head_width is None
        else jnp.asarray(trained_positions(mask, minimum=head_width)),
        positions=jnp.asarray(p.positions),
        segments=jnp.asarray(p.segments),
        sequences=jnp.asarray(p.sequences),
        sequence_weights=weights,
    )


__all__ = [
    "Packing",
    "bin_count",
    "first_fit_decreasing",
    "gather_targets",
    "head_width",
    "mini_batch",
    "packed_tokens",
    "plan",
    "plan_step",
    "row_lengths",
    "scatter_targets",
]
