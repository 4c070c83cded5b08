"""`TrainerGroup` over an in-memory `TrainerHosts` (the transport is the fake; the group's
row split and answers are what is tested; real processes: test_spmd.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from rl_core.errors import TrainerHostLost
from rl_core.training.trainer import TrainBatch, TrainerConfig
from rl_core.training.trainer_group import TrainerGroup


class FakeHosts:
    """K processes that record what each was sent and answer as process i would."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.sent: list[tuple[str, list[Any]]] = []
        self.updates = 0
        self.lost = False

    def call(self, method: str, payloads: Sequence[Any]) -> list[Any]:
        if self.lost:
            raise TrainerHostLost(f"{method}: trainer process 1 of {self.count} died")
        self.sent.append((method, list(payloads)))
        if method == "train_step":
            self.updates += 1
            return [{"loss": float(i), "optimizer_updates": float(self.updates)} for i in range(2)]
        if method in ("params", "training_state"):
            return [{"w": np.full(2, self.updates)}] + [None] * (self.count - 1)
        return [None] * self.count

    def close(self) -> None:
        self.lost = True


def batch(rows: int) -> TrainBatch:
    tokens = np.arange(rows * 4, dtype=np.int32).reshape(rows, 4)
    mask = np.ones((rows, 4), np.float32)
    return TrainBatch(tokens, mask, -mask, np.arange(rows, dtype=np.float32), groups=None)


def test_each_process_gets_its_rows_in_order_and_process_0_answers() -> None:
    hosts = FakeHosts(2)
    group = TrainerGroup(hosts, TrainerConfig())
    metrics = group.train_step(batch(4))
    assert metrics == {"loss": 0.0, "optimizer_updates": 1.0}  # process 0's
    method, parts = hosts.sent[-1]
    assert method == "train_step" and len(parts) == 2
    assert parts[0].tokens.tolist() == batch(4).tokens[:2].tolist()
    assert parts[1].tokens.tolist() == batch(4).tokens[2:].tolist()
    assert parts[1].advantages.tolist() == [2.0, 3.0] and parts[1].lag is None


def test_params_are_fetched_once_per_update() -> None:
    hosts = FakeHosts(2)
    group = TrainerGroup(hosts, TrainerConfig())
    group.train_step(batch(2))
    first = group.params()
    assert group.params() is first and [m for m, _ in hosts.sent].count("params") == 1
    group.train_step(batch(2))
    assert group.params()["w"].tolist() == [2, 2]


def test_a_restored_state_reaches_every_process_as_host_arrays() -> None:
    hosts = FakeHosts(2)
    group = TrainerGroup(hosts, TrainerConfig())
    group.load_training_state({"updates": np.asarray(7), "w": np.ones(3, np.float32)})
    method, parts = hosts.sent[-1]
    assert method == "load_training_state" and len(parts) == 2
    assert all(isinstance(p["w"], np.ndarray) and p["w"].tolist() == [1, 1, 1] for p in parts)


def test_rows_that_do_not_split_and_a_lost_process_are_errors() -> None:
    hosts = FakeHosts(2)
    group = TrainerGroup(hosts, TrainerConfig())
    with pytest.raises(ValueError, match="3 batch rows do not split over 2 trainer processes"):
        group.train_step(batch(3))
    with pytest.raises(ValueError, match="for LoRA runs"):
        group.adapters()
    group.close()
    with pytest.raises(TrainerHostLost, match="died"):
        group.train_step(batch(2))
