"""The trainer as the pipeline sees it, and a trainer spread over K processes behind it.

`TrainerAPI` is every call the pipeline and the checkpoints make of a trainer. A
`Trainer` satisfies it in-process; a `TrainerGroup` satisfies it by sending each call
to K trainer processes (`rl_core.training.spmd.TrainerHost` in each) through a
`TrainerHosts` transport, each process given its own rows of a batch, and answering
with what process 0 returns. The transport starts, reaches and stops the processes
(Ray actors: worker/trainer_hosts.py; spawned children: rl_core.training.local_hosts);
this module knows none of them.

Errors (`rl_core.errors`)::

    RlCoreError
    └── TrainerHostLost    a trainer process died, or a call to the K passed its timeout:
                           all K are stopped; the attempt ends and the run resumes from
                           its last checkpoint, as when a worker is lost
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from rl_core.errors import TrainerHostLost

if TYPE_CHECKING:  # no JAX at import: the worker imports the error from here
    from rl_core.training.trainer import TrainBatch, TrainerConfig


class TrainerAPI(Protocol):
    """What the pipeline (`rl_core.pipeline.pipeline`) and the checkpoints
    (`rl_core.training.checkpointing`) call on a trainer."""

    config: TrainerConfig

    def train_step(self, batch: TrainBatch) -> dict[str, float]: ...

    def params(self) -> Any: ...

    def adapters(self) -> Any: ...

    def training_state(self) -> dict[str, Any]: ...

    def load_training_state(self, state: dict[str, Any]) -> None: ...


class TrainerHosts(Protocol):
    """K started trainer processes, each holding a `TrainerHost`."""

    @property
    def count(self) -> int: ...

    def call(self, method: str, payloads: Sequence[Any]) -> list[Any]:
        """``TrainerHost.handle(method, payloads[i])`` on process i, all K at once; their
        answers in process order. Raises `TrainerHostLost` (all K stopped first) when one
        dies or the call passes the transport's timeout: the survivors may be blocked in
        a collective that will never complete, so nothing waits on them unbounded."""
        ...

    def close(self) -> None:
        """Stop every process (idempotent)."""
        ...


class TrainerGroup:
    """A `TrainerAPI` over ``hosts``: one trainer, data-parallel over their processes.

    Every call goes to all K processes (they run the same collectives); a batch's rows
    are split into K equal contiguous parts, process i taking part i, so the global batch
    each step sees is the one given here, row for row. What comes back (metrics, the
    policy, the training state) is process 0's: host arrays, the full policy (the
    processes hold it replicated).
    """

    def __init__(self, hosts: TrainerHosts, config: TrainerConfig) -> None:
        self.hosts = hosts
        self.config = config
        self._updates = -1
        self._params: Any = None

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        from rl_core.training.spmd import local_batch, split_rows

        parts = split_rows(batch.tokens.shape[0], self.hosts.count)
        answers = self.hosts.call("train_step", [local_batch(batch, part) for part in parts])
        metrics: dict[str, float] = answers[0]
        self._updates = int(metrics["optimizer_updates"])
        return metrics

    def params(self) -> Any:
        """The policy (LoRA merged) as host arrays in `nnx.state(model)`'s structure."""
        if self._params is None or self._params[0] != self._updates:
            self._params = (self._updates, self._first("params"))
        return self._params[1]

    def adapters(self) -> Any:
        if self.config.lora is None:
            raise ValueError("adapters() is for LoRA runs; this trainer trains every weight")
        return self._first("adapters")

    def training_state(self) -> dict[str, Any]:
        state: dict[str, Any] = self._first("training_state")
        return state

    def load_training_state(self, state: dict[str, Any]) -> None:
        from rl_core.training.spmd import to_host

        host = to_host(state)  # restored arrays leave this process as host copies
        self.hosts.call("load_training_state", [host] * self.hosts.count)
        self._updates = int(host["updates"])
        self._params = None

    def close(self) -> None:
        self.hosts.close()

    def _first(self, method: str) -> Any:
        return self.hosts.call(method, [None] * self.hosts.count)[0]


__all__ = ["TrainerAPI", "TrainerGroup", "TrainerHostLost", "TrainerHosts"]
