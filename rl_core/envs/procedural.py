"""Procedural sources of the ``dataset`` environment: a reasoning-gym task as rows.

``dataset: reasoning_gym:<task>`` names a task of reasoning-gym; its rows are
generated, not read: row ``i`` is the task's item ``i`` of the dataset built from
(``dataset_config``, ``seed``), which reasoning-gym makes from ``seed + i`` alone, so
the same config and seed give the same tasks on any worker, and a resumed run plays
the rows it would have played. The dataset is built by the `reasoning_gym`
environment's own `load_dataset` (its checks of the task's config included), and an
answer is scored by the task's own scorer through its `score`.

Rows by index::

    [0, n_eval)                 the eval split: split.size rows, or a share of size
    [n_eval, size)              the train split, ordered by epochs as a file's rows are
    [n_eval, ∞)                 with size null: training task t plays row n_eval + t

The held-out rows are a fixed index range, disjoint from the train rows; a
generator may still make the same question twice (a small task space), as it may
within the train split.

A row is ``{"prompt": question, "question": question, "answer": answer}``; the
item itself (its metadata) stays here for the scorer.
"""

from __future__ import annotations

from typing import Any

from rl_core.envs.reasoning_gym import load_dataset, score
from rl_core.envs.row_order import EpochOrder, held_out, held_out_row
from rl_core.errors import EnvironmentFailure
from rl_core.protocol.datasets import DatasetConfig
from rl_core.protocol.ecosystem import ReasoningGymConfig

# reasoning-gym's datasets take a size; an unbounded source asks for the most its config
# allows and never reaches it (ten million training tasks).
UNBOUNDED = 10_000_000


class ProceduralRows:
    """A procedural source's rows by index, with `RowFile`'s interface (``train_row``,
    ``eval_row``, ``read``) and the scorer of a row's answers."""

    def __init__(self, cfg: DatasetConfig) -> None:
        task = cfg.task
        if task is None:
            raise EnvironmentFailure(f"dataset: {cfg.dataset!r} is not a procedural source")
        total = cfg.size if cfg.size is not None else UNBOUNDED
        n_eval = held_out(cfg.split, total) if cfg.split is not None else 0
        if n_eval >= total:
            raise EnvironmentFailure(
                f"dataset: the split holds out {n_eval} of {total} rows and leaves none to "
                "train on; hold out fewer, or raise config.size"
            )
        self.source = cfg.dataset
        self.dataset = load_dataset(
            ReasoningGymConfig(
                dataset=task, dataset_config=cfg.dataset_config, seed=cfg.seed, size=total
            )
        )
        self.eval = range(n_eval)
        self.train = range(n_eval, total)
        self._sized = cfg.size is not None
        self._order = EpochOrder(self.train)

    def train_row(self, task: int, cfg: DatasetConfig) -> int:
        if self._sized:
            return self._order.row(task, cfg)
        # Unbounded: every training task a fresh row, in order (the rows are random already).
        return self.train[task % len(self.train)]

    def eval_row(self, index: int) -> int:
        return held_out_row(self.eval, index)

    def item(self, row: int) -> dict[str, Any]:
        """The task's item of row ``row``: question, answer, metadata."""
        entry: dict[str, Any] = self.dataset[row]
        return entry

    def read(self, row: int) -> dict[str, Any]:
        entry = self.item(row)
        question = entry["question"]
        return {"prompt": question, "question": question, "answer": entry["answer"]}

    def score(self, row: int, content: str) -> float:
        """The task's own score of the answer in ``content`` to row ``row``."""
        return score(self.dataset, self.item(row), content)[1]


__all__ = ["UNBOUNDED", "ProceduralRows"]
