"""Host side of prefix-shared training: which rows share which prefix, in fixed shapes.

The trainer (`TrainerConfig.share_prefix`) lays a batch's rows out group by group: the
groups `build_batch` names (`TrainBatch.groups`), or, without names, runs of consecutive
rows that share a prefix. Rows that train on nothing (padding, stale members) are left
out: they add nothing to the loss, its counts or its metrics. With several mini-batches
the *groups* are shuffled (the plain path shuffles rows), then the rows, in that order,
are cut into ``mini_batches`` near-equal slices and each into ``micro_batches``; a
micro-batch holds at most the plain path's rows per micro-batch, so its memory bound
holds. A group that a cut runs through continues in the next slice as its own block; its
prompt is then computed once per slice instead of once per member.

Each block's prefix is its rows' common prefix, capped at the first position any of
them trains on (`rl_core.training.prefix_shared` says why that boundary is exact).
Shapes are bucketed so compiles stay few: the prefix length P by quarter octaves (a
run's prompt length barely moves, so a finer bucket costs no compiles and pads less);
the suffix length S, which follows the batch's longest answer, and the blocks per
micro-batch N by powers of two, as the plain path buckets its length. When sharing
would save fewer than ``min_saving`` positions per row against the plain path's ``T-1``
(a short prompt, or a group whose members share nothing so S is the whole row), the
step runs the plain forward over the same rows.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rl_core.models.buckets import next_bucket, quarter_bucket
from rl_core.training import train_step as ts
from rl_core.training.head_positions import shifted_positions
from rl_core.training.prefix_shared import SharedPrefix, take

Blocks = list[np.ndarray]  # rows of one micro-batch, each array a block sharing a prefix


@dataclasses.dataclass(frozen=True)
class Layout:
    """One mini-batch: ``micro_batches`` micro-batches of ``rows`` slots each, in order."""

    rows: np.ndarray  # [M*R] int32: the batch row in each slot; -1 padding
    offsets: np.ndarray  # [M*R] int32: where each slot's suffix starts (0: the whole row)
    width: int  # positions per slot: S (shared) or T-1 (plain)
    prefix: np.ndarray | None  # [M*N, P] int32; None: the plain forward over whole rows
    prefix_lengths: np.ndarray | None  # [M*N] int32 (0: a padding slot)
    owner: np.ndarray | None  # [M*R] int32: the slot's prefix within its micro-batch


def trained_spans(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # [B, T-1] -> [B], [B]
    """Per row, the first trained position and one past the last (T-1 and 0: none)."""
    trained = mask > 0
    some = trained.any(axis=1)
    length = mask.shape[1]
    first = np.where(some, trained.argmax(axis=1), length)
    end = np.where(some, length - trained[:, ::-1].argmax(axis=1), 0)
    return first.astype(np.int64), end.astype(np.int64)


def shared_length(tokens: np.ndarray, first: np.ndarray) -> int:  # [k, T], [k] -> p
    """How many leading tokens the rows share and may share: their common prefix, capped
    at the first position any of them trains on (its input is the suffix's first)."""
    same = (tokens == tokens[:1]).all(axis=0)
    common = tokens.shape[1] if same.all() else int(same.argmin())
    return max(0, min(common, int(first.min())))


def row_groups(
    tokens: np.ndarray,  # [B, T]
    mask: np.ndarray,  # [B, T-1]
    groups: np.ndarray | None,  # [B] int: each row's group (< 0: none); None: infer
    min_saving: int,
) -> list[np.ndarray]:
    """The trained rows, by group, in order of each group's first row. Without names, a
    row joins the previous row's group when the two share at least ``min_saving``
    tokens before either trains."""
    first, _ = trained_spans(mask)
    trained = np.flatnonzero(first < mask.shape[1])
    if groups is not None:
        # A trained row in no group (< 0) is a group of its own: its prompt, once.
        keys = [int(groups[r]) if groups[r] >= 0 else -1 - int(r) for r in trained]
        members: dict[int, list[int]] = {}
        for r, k in zip(trained, keys, strict=True):
            members.setdefault(k, []).append(int(r))
        return [np.asarray(rows, np.int64) for rows in members.values()]
    out: list[list[int]] = []
    for r in trained:
        prev = out[-1][-1] if out else None
        pair = np.asarray([prev, r]) if prev is not None else None
        if pair is not None and shared_length(tokens[pair], first[pair]) >= min_saving:
            out[-1].append(int(r))
        else:
            out.append([int(r)])
    return [np.asarray(g, np.int64) for g in out]


def _cut(n: int, parts: int) -> list[int]:
    base, extra = divmod(n, parts)
    return [base + (i < extra) for i in range(parts)]


def plan(
    groups: Sequence[np.ndarray], order: np.ndarray | None, mini_batches: int, micro_batches: int
) -> list[list[Blocks]]:  # mini-batch -> micro-batch -> blocks
    """Rows group by group (``order``: a permutation of the groups), cut into near-equal
    mini- and micro-batches; a micro-batch's rows of one group form one block."""
    ordered = [groups[i] for i in order] if order is not None else list(groups)
    rows = np.concatenate(ordered) if ordered else np.zeros((0,), np.int64)
    label = np.concatenate([np.full(len(g), i) for i, g in enumerate(ordered)] or [rows])
    minis: list[list[Blocks]] = []
    at = 0
    for mini_size in _cut(len(rows), mini_batches):
        micros: list[Blocks] = []
        for size in _cut(mini_size, micro_batches):
            part, tag = rows[at : at + size], label[at : at + size]
            breaks = np.flatnonzero(np.diff(tag)) + 1
            micros.append([b for b in np.split(part, breaks) if len(b)])
            at += size
        minis.append(micros)
    return minis


def layouts(
    tokens: np.ndarray,  # [B, T]
    mask: np.ndarray,  # [B, T-1]
    minis: list[list[Blocks]],
    *,
    rows_per_micro: int,
    min_saving: int,
) -> tuple[list[Layout], bool]:  # the mini-batches' layouts; whether they share
    """Fixed-shape layouts of ``plan``'s mini-batches: shared when that saves at least
    ``min_saving`` positions per row, else the plain forward over the same rows."""
    first, end = trained_spans(mask)
    length = mask.shape[1]
    # Per mini-batch, per micro-batch, per block: how many tokens its rows share.
    shares = [[[shared_length(tokens[b], first[b]) for b in bs] for bs in ms] for ms in minis]
    spans = [
        int((end[b] - q).max())
        for ms, qs in zip(minis, shares, strict=True)
        for bs, qq in zip(ms, qs, strict=True)
        for b, q in zip(bs, qq, strict=True)
    ]
    p = min(
        quarter_bucket(max((q for qs in shares for qq in qs for q in qq), default=0), 16), length
    )
    s = min(next_bucket(max(spans, default=0), 16), length)
    n = next_bucket(max((len(bs) for ms in minis for bs in ms), default=1), 1)
    # Positions per row: the plain path's T-1 against a share of the prefixes plus S.
    saving = length - (n * p / rows_per_micro + s)
    shared = bool(spans) and saving >= min_saving
    out = []
    for micros, qs in zip(minis, shares, strict=True):
        rows = np.full((len(micros), rows_per_micro), -1, np.int32)
        offsets = np.zeros(rows.shape, np.int32)
        owner = np.zeros(rows.shape, np.int32)
        prefix = np.zeros((len(micros), n, p), np.int32)
        lengths = np.zeros((len(micros), n), np.int32)
        for m, (bs, qq) in enumerate(zip(micros, qs, strict=True)):
            at = 0
            for slot, (block, shared_p) in enumerate(zip(bs, qq, strict=True)):
                k = len(block)
                assert at + k <= rows_per_micro, "a micro-batch holds more rows than the plain one"
                rows[m, at : at + k] = block
                if shared:
                    offsets[m, at : at + k] = shared_p
                    owner[m, at : at + k] = slot
                    prefix[m, slot, :shared_p] = tokens[block[0], :shared_p]
                    lengths[m, slot] = shared_p
                at += k
        flat = rows.reshape(-1)
        if shared:
            out.append(
                Layout(
                    flat,
                    offsets.reshape(-1),
                    s,
                    prefix.reshape(-1, p),
                    lengths.reshape(-1),
                    owner.reshape(-1),
                )
            )
        else:
            out.append(Layout(flat, offsets.reshape(-1), length, None, None, None))
    return out, shared


def mini_batch(full: ts.MiniBatch, layout: Layout) -> ts.MiniBatch:
    """The rows of ``full`` (the batch, in row layout) that ``layout`` lays out, cut to
    their suffixes and carrying their prefixes when it shares."""
    rows, offsets, width = jnp.asarray(layout.rows), jnp.asarray(layout.offsets), layout.width
    picked: ts.MiniBatch = _take(full, rows, offsets, width)
    return picked._replace(prefix=_prefix(layout))


def suffixes(
    tokens: jax.Array,  # [B, T]
    layout: Layout,
) -> tuple[jax.Array, SharedPrefix | None]:  # [R, S+1] (plain: [R, T]), the prefixes
    """The tokens ``layout`` lays out, for a forward without a loss (scoring)."""
    rows, offsets = jnp.asarray(layout.rows), jnp.asarray(layout.offsets)
    return take(tokens, rows, offsets, layout.width + 1), _prefix(layout)


def _prefix(layout: Layout) -> SharedPrefix | None:
    if layout.prefix is None:
        return None
    assert layout.prefix_lengths is not None and layout.owner is not None
    return SharedPrefix(
        jnp.asarray(layout.prefix), jnp.asarray(layout.prefix_lengths), jnp.asarray(layout.owner)
    )


@functools.partial(jax.jit, static_argnames="width")
def _take(full: ts.MiniBatch, rows: jax.Array, offsets: jax.Array, width: int) -> ts.MiniBatch:
    def cut(x: jax.Array | None) -> jax.Array | None:
        return None if x is None else take(x, rows, offsets, width)

    return ts.MiniBatch(
        tokens=take(full.tokens, rows, offsets, width + 1),
        mask=take(full.mask, rows, offsets, width),
        behaviour=take(full.behaviour, rows, offsets, width),
        lag=cut(full.lag),
        advantages=take(full.advantages, rows, offsets, width),
        old_logprobs=cut(full.old_logprobs),
        ref_logprobs=cut(full.ref_logprobs),
        old_values=cut(full.old_values),
        returns=cut(full.returns),
        trained_at=None
        if full.trained_at is None
        else shifted_positions(full.trained_at, rows, offsets),
    )


def micro_layouts(layout: Layout, parts: int) -> Iterator[Layout]:
    """A shared layout's micro-batches, each a layout of its own."""
    assert layout.prefix is not None and layout.prefix_lengths is not None
    assert layout.owner is not None
    r, n = len(layout.rows) // parts, len(layout.prefix) // parts
    for i in range(parts):
        rs, ns = slice(i * r, (i + 1) * r), slice(i * n, (i + 1) * n)
        yield dataclasses.replace(
            layout,
            rows=layout.rows[rs],
            offsets=layout.offsets[rs],
            prefix=layout.prefix[ns],
            prefix_lengths=layout.prefix_lengths[ns],
            owner=layout.owner[rs],
        )


__all__ = [
    "Layout",
    "layouts",
    "micro_layouts",
    "mini_batch",
    "plan",
    "row_groups",
    "shared_length",
    "suffixes",
    "trained_spans",
]
