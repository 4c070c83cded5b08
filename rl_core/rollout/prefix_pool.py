"""Which finished sequences' keys and values the engine keeps, and which prompt continues one.

An agent's next prompt is its last prompt, the model's answer and the environment's
observation: everything but the observation was in the KV cache when the answer ended.
Prefilled afresh, a 12-turn episode reads its first turn's tokens twelve times. The
engine instead copies a finished row's keys and values into a row of a *prefix pool*,
and a later prompt that starts with those tokens takes the row back and prefills only
what is new (`rl_core.rollout.steps` `extend`).

This module is the host-side index, no device work: a parked sequence is found by the
hash of its tokens at its last 16-token block boundary, the way vLLM's prefix cache
keys blocks (each block's hash folds in the one before, so a key names the whole
prefix); a hit is then checked token for token, so a hash collision can cost a prefill,
never a wrong answer. A prompt matches the longest parked prefix at a block boundary;
the few tokens after it are prefilled again.

Keys and values belong to the weights that computed them: an entry is used only by the
policy version that parked it (after a weight update its prompt is prefilled afresh with
the new weights, as AReaL does on an update). A sequence whose decode spanned an update
is never parked. The same holds for an adapter (an engine with adapter slots): an entry
carries a tag, the adapter's slot and that slot's version (None for the base alone), folded
into its hashes and checked on a hit, so two adapters never share a prefix, even of the
same tokens, and a slot's entries are unreachable once it holds another adapter (`retain`
gives their rows back).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

BLOCK = 16  # tokens per hashed block: a hit reuses a multiple of this
# Whose weights computed an entry: (adapter slot, that slot's version); None: the base alone.
Tag = tuple[int, int] | None


def block_hashes(tokens: Sequence[int], blocks: int, tag: Tag = None) -> list[int]:
    """Hashes of the first 1, 2, .. ``blocks`` blocks of ``tokens``, each folding in the last
    (the first folds in ``tag``: whose weights computed them)."""
    out: list[int] = []
    h = 0 if tag is None else hash(tag)
    for b in range(blocks):
        h = hash((h, tuple(tokens[b * BLOCK : (b + 1) * BLOCK])))
        out.append(h)
    return out


@dataclasses.dataclass
class _Entry:
    tokens: np.ndarray  # [n] int32: the tokens whose keys and values the row holds
    key: int  # block hash of tokens[:n // BLOCK * BLOCK]
    version: int
    tick: int  # last use, for least-recently-used eviction
    tag: Tag = None  # the adapter (slot, version) that computed it; None: the base


@dataclasses.dataclass(frozen=True)
class Hit:
    row: int  # the pool row holding the prefix
    start: int  # tokens of the prompt already in that row; prefill from here


class PrefixIndex:
    """Rows of the pool in use, keyed by the prefix they hold. Not thread-safe (one
    scheduler, one thread)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self._entries: dict[int, _Entry] = {}  # pool row -> what it holds
        self._by_key: dict[int, int] = {}  # block hash -> pool row
        self._tick = 0
        self.hits = 0
        self.misses = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def park(self, tokens: Sequence[int], version: int, tag: Tag = None) -> int | None:
        """The pool row to copy a finished sequence's keys and values into (None: too short
        to be worth a row). An older entry for the same prefix (and tag) gives up its row."""
        blocks = len(tokens) // BLOCK
        if blocks == 0 or self.rows == 0:
            return None
        key = block_hashes(tokens, blocks, tag)[-1]
        row = self._by_key.get(key)
        if row is None:
            row = self._free_row(version)
        else:
            self._drop(row)
        self._tick += 1
        self._entries[row] = _Entry(np.asarray(tokens, np.int32), key, version, self._tick, tag)
        self._by_key[key] = row
        return row

    def take(
        self, prompt: Sequence[int], version: int, tag: Tag = None, *, max_new: int
    ) -> Hit | None:
        """The longest prefix of ``prompt`` parked under ``tag`` that leaves at most
        ``max_new`` tokens to prefill (and at least one: its last position's logits give the
        first token); the row is handed over, and leaves the index."""
        if not self._entries:
            self.misses += 1
            return None
        blocks = (len(prompt) - 1) // BLOCK
        hashes = block_hashes(prompt, blocks, tag)
        for b in range(blocks, 0, -1):
            start = b * BLOCK
            if len(prompt) - start > max_new:
                break
            row = self._by_key.get(hashes[b - 1])
            if row is None:
                continue
            entry = self._entries[row]
            if entry.version != version:
                self._drop(row)  # computed by other weights: useless from now on
                continue
            if entry.tag != tag or not np.array_equal(
                entry.tokens[:start], np.asarray(prompt[:start], np.int32)
            ):
                continue  # a hash collision
            self._drop(row)
            self.hits += 1
            self.reused_tokens += start
            return Hit(row, start)
        self.misses += 1
        return None

    def clear(self) -> None:
        self._entries.clear()
        self._by_key.clear()

    def retain(self, keep: Callable[[Tag], bool]) -> None:
        """Drop every entry whose tag ``keep`` refuses (an adapter slot that was set again)."""
        for row in [r for r, e in self._entries.items() if not keep(e.tag)]:
            self._drop(row)

    def _drop(self, row: int) -> None:
        entry = self._entries.pop(row)
        if self._by_key.get(entry.key) == row:
            del self._by_key[entry.key]

    def _free_row(self, version: int) -> int:
        if len(self._entries) < self.rows:
            return next(r for r in range(self.rows) if r not in self._entries)
        # Evict what cannot hit any more (older weights) first, then the least recent.
        victim = min(
            self._entries,
            key=lambda r: (self._entries[r].version == version, self._entries[r].tick),
        )
        self._drop(victim)
        return victim
