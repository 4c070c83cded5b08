"""One trainer as an SPMD program over K processes ("hosts"): what runs inside each of them.

Multi-controller JAX: every process runs the same Python, calls the same jitted steps in
the same order, and `jax.distributed` joins their devices into one global device set.
Here the K processes are data-parallel: the mesh's ``data`` axis spans every device of
every process (process by process), the weights and optimiser state are replicated on
all of them, and each process feeds only its own rows of a batch
(`jax.make_array_from_process_local_data`). XLA's gradient reduction over ``data`` then
crosses processes (gloo on CPU, NCCL on GPU). Replication keeps every process holding
the full policy, so process 0 answers ``params()`` and ``training_state()`` alone, with
no gather: an fsdp axis over processes would need one, run by all K (not built).

`TrainerHost` wraps a `Trainer` built over such a mesh and answers the calls a
`rl_core.training.trainer_group.TrainerGroup` sends (``handle(method, payload)``); how
the calls travel (Ray actors, spawned processes) is the transport's business.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from rl_core.models.sharding import P, batch_sharding, make_mesh
from rl_core.training.trainer import TrainBatch, Trainer


def init_distributed(
    coordinator: str, num_processes: int, process_id: int, *, timeout_s: int = 120
) -> None:
    """Join the K-process JAX job; call before anything touches a device.

    CPU devices talk over gloo (``jax_cpu_collectives_implementation``, jax 0.10's name);
    without it a CPU computation spanning processes fails to compile. GPU collectives
    are NCCL whatever this says, so it is set unconditionally.
    """
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # type: ignore[no-untyped-call]
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=timeout_s,
    )


def global_mesh() -> Mesh:
    """Every device of every process on the ``data`` axis, process by process: process
    i's rows of a batch are then rows ``[i*B/K, (i+1)*B/K)`` of the global batch."""
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return make_mesh(data=len(devices), devices=devices)


def replicated(tree: Any, mesh: Mesh) -> Any:
    """``tree``'s arrays (host or device, the same on every process) replicated on ``mesh``.

    Typed PRNG keys are carried as their key data and wrapped again.
    """
    sharding = NamedSharding(mesh, P())

    def place(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = place(jax.random.key_data(leaf))
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
        host = np.asarray(leaf)
        return jax.make_array_from_process_local_data(sharding, host, host.shape)  # type: ignore[no-untyped-call]

    return jax.tree.map(place, tree)


def to_host(tree: Any) -> Any:
    """Numpy copies of a replicated tree's arrays (this process's copy; no collective)."""
    return jax.tree.map(lambda x: np.asarray(x), tree)


def split_rows(rows: int, processes: int) -> list[slice]:
    """Process i's rows of a ``rows``-row batch: equal contiguous slices, in process order."""
    if rows % processes:
        raise ValueError(f"{rows} batch rows do not split over {processes} trainer processes")
    size = rows // processes
    return [slice(i * size, (i + 1) * size) for i in range(processes)]


def local_batch(batch: TrainBatch, part: slice) -> TrainBatch:
    """The rows ``part`` of every per-row field of ``batch``."""
    fields: dict[str, Any] = {
        name: None if value is None else value[part] for name, value in vars(batch).items()
    }
    return dataclasses.replace(batch, **fields)


def global_batch(local: TrainBatch, mesh: Mesh, processes: int) -> TrainBatch:
    """One process's rows as the global batch's arrays: every process passes its own part,
    in process order, and each array's rows are split over the mesh's ``data`` axis."""

    def place(value: np.ndarray | None) -> Any:
        if value is None:
            return None
        shape = (value.shape[0] * processes, *value.shape[1:])
        return jax.make_array_from_process_local_data(  # type: ignore[no-untyped-call]
            batch_sharding(mesh, value.ndim), np.asarray(value), shape
        )

    fields = {name: place(value) for name, value in vars(local).items()}
    # Global jax.Arrays where the dataclass says host arrays: Trainer.train_step reads both.
    return TrainBatch(**fields)


class TrainerHost:
    """One process's share of a K-process trainer: a `Trainer` over the global mesh.

    ``make_trainer(mesh)`` builds the trainer from weights already replicated on ``mesh``
    (every process builds the same one). Every call must reach every process in the same
    order (they run the same collectives); the answers that carry the whole policy come
    from process 0 (the others answer None, having taken part).
    """

    def __init__(self, make_trainer: Callable[[Mesh], Trainer]) -> None:
        self.process = jax.process_index()
        self.processes = jax.process_count()
        self.mesh = global_mesh()
        trainer = make_trainer(self.mesh)
        # What the constructor made on this process's default device alone (optimiser
        # counters, LoRA adapters from its RNG, the RNG key) joins the mesh too.
        trainer.load_training_state(replicated(trainer.training_state(), self.mesh))
        self.trainer = trainer

    def handle(self, method: str, payload: Any) -> Any:
        """Run ``method`` (a `TrainerGroup` call) with this process's ``payload``."""
        with jax.set_mesh(self.mesh):
            if method == "train_step":
                batch = global_batch(payload, self.mesh, self.processes)
                return self.trainer.train_step(batch)
            if method == "params":
                return self._from_first(lambda: self.trainer.params())
            if method == "adapters":
                return self._from_first(self.trainer.adapters)
            if method == "training_state":
                return self._from_first(self.trainer.training_state)
            if method == "load_training_state":
                self.trainer.load_training_state(replicated(payload, self.mesh))
                return None
            if method == "ping":
                return self.process
        raise ValueError(f"a trainer host has no call {method!r}")

    def _from_first(self, read: Callable[[], Any]) -> Any:
        tree = read()  # on every process: reading may run a computation over the mesh
        return to_host(tree) if self.process == 0 else None


__all__ = [
    "TrainerHost",
    "global_batch",
    "global_mesh",
    "init_distributed",
    "local_batch",
    "replicated",
    "split_rows",
    "to_host",
]
