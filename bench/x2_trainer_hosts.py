"""X2 (issue #36): one train step of the same global batch on K = 1 and K = 2 trainer
processes (`rl_core.training.spmd`: jax.distributed, gloo on CPU, data-parallel), with the
share of the step spent in the gradient all-reduce and a model's prediction.

- ``K=1`` / ``K=2``: a `TrainerGroup` over `LocalHosts` (spawned processes, as
  ``rlaas train`` starts them; Ray adds only its actor calls), the same code path for
  both; each step's global batch is split by rows over the processes. Median of
  ``--steps`` steps after one that compiles.
- ``all-reduce``: K processes of their own sum a float32 array of the model's parameter
  count over the ``data`` axis (what the step's gradient reduction moves), median of 10.
- ``call``: a round trip of an empty call to the K processes (the transport's overhead).
- the model: ``t(K) = t(1) / K + all-reduce + call`` (compute split evenly, the
  reduction and the call not overlapped with it).

On this machine the K processes share 2 cores, and one process already uses both (XLA's
CPU threads), so K = 2 cannot be faster here: the figures measure the overheads.

    nice -n 10 .venv/bin/python -m bench.x2_trainer_hosts [--model tiny|small]
        [--rows 16] [--length 128] [--steps 5]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Any

import numpy as np


def bench_trainer(model_name: str, mesh: Any) -> Any:
    """The trainer each process builds: the preset's model, seed 0, replicated."""
    from flax import nnx

    from rl_core.models import Model, ModelConfig
    from rl_core.training.spmd import replicated
    from rl_core.training.trainer import Trainer, TrainerConfig

    config = ModelConfig.small() if model_name == "small" else ModelConfig.tiny()
    model = Model(config, rngs=nnx.Rngs(0))
    nnx.update(model, replicated(nnx.state(model), mesh))
    return Trainer(model, TrainerConfig(learning_rate=1e-4))


def batch(rows: int, length: int, vocab: int) -> Any:
    from rl_core.training.trainer import TrainBatch

    rng = np.random.default_rng(0)
    tokens = rng.integers(3, vocab, size=(rows, length)).astype(np.int32)
    mask = np.zeros((rows, length), np.float32)
    mask[:, length // 2 :] = 1
    adv = rng.normal(size=rows).astype(np.float32)
    return TrainBatch(tokens, mask, np.zeros_like(mask), adv)


def step_times(count: int, model_name: str, train: Any, steps: int) -> tuple[float, float]:
    """(median step seconds, median empty-call seconds) on ``count`` processes."""
    from rl_core.training.local_hosts import LocalHosts
    from rl_core.training.trainer import TrainerConfig
    from rl_core.training.trainer_group import TrainerGroup

    hosts = LocalHosts(count, functools.partial(bench_trainer, model_name))
    group = TrainerGroup(hosts, TrainerConfig(learning_rate=1e-4))
    try:
        group.train_step(train)  # compiles
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            group.train_step(train)
            times.append(time.perf_counter() - start)
        calls = []
        for _ in range(20):
            start = time.perf_counter()
            hosts.call("ping", [None] * count)
            calls.append(time.perf_counter() - start)
    finally:
        group.close()
    return statistics.median(times), statistics.median(calls)


def _allreduce(conn: Any, coordinator: str, count: int, index: int, size: int) -> None:
    import jax
    import jax.numpy as jnp

    from rl_core.models.sharding import batch_sharding
    from rl_core.training.spmd import global_mesh, init_distributed

    init_distributed(coordinator, count, index)
    mesh = global_mesh()
    local = np.ones((1, size), np.float32)
    x = jax.make_array_from_process_local_data(batch_sharding(mesh, 2), local, (count, size))
    total = jax.jit(lambda a: jnp.sum(a, axis=0), out_shardings=jax.NamedSharding(mesh, jax.P()))
    total(x).block_until_ready()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        total(x).block_until_ready()
        times.append(time.perf_counter() - start)
    conn.send(statistics.median(times))


def allreduce_time(count: int, size: int) -> float:
    """Median seconds of summing ``size`` float32 over ``count`` processes (process 0's)."""
    import multiprocessing as mp

    from rl_core.training.local_hosts import free_port

    ctx = mp.get_context("spawn")
    coordinator = f"127.0.0.1:{free_port()}"
    pipes, procs = [], []
    for i in range(count):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_allreduce, args=(child, coordinator, count, i, size))
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    result = float(pipes[0].recv())
    for proc in procs:
        proc.join(timeout=60)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("tiny", "small"), default="small")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    from flax import nnx

    from rl_core.models import Model, ModelConfig

    config = ModelConfig.small() if args.model == "small" else ModelConfig.tiny()
    params = sum(
        int(np.prod(x.shape)) for x in jax_leaves(nnx.state(Model(config, rngs=nnx.Rngs(0))))
    )
    train = batch(args.rows, args.length, config.vocab_size)
    print(f"model {args.model}: {params:,} parameters; batch {args.rows} x {args.length}")
    one, call_one = step_times(1, args.model, train, args.steps)
    two, call_two = step_times(2, args.model, train, args.steps)
    reduce_two = allreduce_time(2, params)
    predicted = one / 2 + reduce_two + call_two
    print(f"{'K':>2} {'step s':>8} {'call ms':>8} {'all-reduce ms':>14} {'predicted s':>12}")
    print(f"{1:>2} {one:8.3f} {call_one * 1e3:8.2f} {0.0:14.1f} {one:12.3f}")
    print(f"{2:>2} {two:8.3f} {call_two * 1e3:8.2f} {reduce_two * 1e3:14.1f} {predicted:12.3f}")
    gbps = params * 4 / reduce_two / 1e9
    print(
        f"K=2 / K=1 step time: {two / one:.2f}; all-reduce share of the K=2 step: "
        f"{reduce_two / two:.1%} ({params * 4 / 1e6:.1f} MB, {gbps:.2f} GB/s); "
        f"measured / predicted: {two / predicted:.2f}"
    )


def jax_leaves(tree: Any) -> list[Any]:
    import jax

    return list(jax.tree.leaves(tree))


if __name__ == "__main__":
    main()
