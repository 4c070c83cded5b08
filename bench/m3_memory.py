"""M3: peak memory (RSS) over a long run of train steps: does it grow?

The trainer trains the builtin ``small`` preset (about 1.5M parameters) on random
batches whose lengths vary between two buckets, calls ``params()`` every step (as the
weight sync does) and saves a checkpoint every ``--checkpoint-every`` steps: the things a
long run repeats. RSS is sampled after every step; the report compares the RSS after
warm-up (step ``--warmup``: every program compiled, one checkpoint written) with the
end, and gives the peak.
No growth means end - warm-up stays within noise (a few MB), not proportional to steps;
the verdict compares the median RSS of the last quarter with the quarter before
(growth of at most 5 MB per 1,000 steps).
By default glibc's malloc arenas are capped at 2, as `rlaas worker` and `rlaas train`
do (``rl_core.host.memory``); ``--default-malloc`` is the baseline without the cap.

    .venv/bin/python bench/m3_memory.py --quick     # 200 steps
    .venv/bin/python bench/m3_memory.py             # 1000 steps
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import psutil

SLOPE_LIMIT_MB = 5.0  # per 1,000 steps: a few MB is the allocator's noise, not a leak


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help="leave glibc's arenas as they are (the baseline), instead of what `rlaas worker` "
        "and `rlaas train` set (rl_core.host.memory.limit_malloc_arenas)",
    )
    args = parser.parse_args(argv)
    if not args.default_malloc:
        from rl_core.host.memory import limit_malloc_arenas

        limit_malloc_arenas()
    steps = args.steps or (200 if args.quick else 1000)

    from flax import nnx

    from rl_core.models import Model, ModelConfig
    from rl_core.training.checkpointing import checkpoint_dir, save_checkpoint
    from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

    proc = psutil.Process()
    config = ModelConfig.small()
    trainer = Trainer(
        Model(config, rngs=nnx.Rngs(0)),
        TrainerConfig(
            learning_rate=1e-4, lr_schedule="cosine", total_steps=steps * 2, mini_batches=2
        ),
    )
    rng = np.random.default_rng(0)
    rss: list[float] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as artifacts:
        for step in range(1, steps + 1):
            seqs, masks, lps = [], [], []
            for _ in range(8):
                n = int(rng.integers(20, 60))  # buckets 32 and 64
                seqs.append(rng.integers(3, config.vocab_size, size=n).tolist())
                masks.append([0] * (n // 2) + [1] * (n - n // 2))
                lps.append([0.0] * (n // 2) + (-rng.uniform(1, 5, size=n - n // 2)).tolist())
            adv = rng.normal(size=8).tolist()
            trainer.train_step(TrainBatch.pack(seqs, masks, lps, adv, rows=8))
            trainer.params()
            # One checkpoint inside the warm-up too: its first call loads Orbax and
            # tensorstore (tens of MB, once), which is not growth.
            if step % args.checkpoint_every == 0 or step == args.warmup:
                save_checkpoint(
                    checkpoint_dir(Path(artifacts), step), step=step, trainer=trainer, extra={}
                )
            rss.append(proc.memory_info().rss / 2**20)
    elapsed = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    warm = rss[min(args.warmup, steps) - 1]
    mid = rss[len(rss) // 2]
    end = rss[-1]
    print(f"M3 memory, builtin small ({config.d_model}d x {config.n_layers}), {steps} train steps")
    print(f"({elapsed:.0f} s, checkpoint every {args.checkpoint_every})")
    print(f"{'RSS MB at step':>16} {args.warmup:>6} {len(rss) // 2:>6} {steps:>6} {'peak':>7}")
    print(f"{'':>16} {warm:6.0f} {mid:6.0f} {end:6.0f} {peak:7.0f}")
    growth = end - warm
    per_100 = growth / max(steps - args.warmup, 1) * 100
    print(f"growth after warm-up: {growth:+.1f} MB ({per_100:+.2f} MB per 100 steps)")
    # The first steps fill allocator pools; a leak shows as growth that persists. So the
    # verdict compares the median RSS of the last quarter of the run with that of the
    # quarter before it (medians: a checkpoint save lifts RSS for a step or two).
    quarter = max(len(rss) // 4, 1)
    q3 = float(np.median(rss[-2 * quarter : -quarter]))
    q4 = float(np.median(rss[-quarter:]))
    per_1000 = (q4 - q3) / quarter * 1000
    flat = per_1000 <= SLOPE_LIMIT_MB
    print(
        f"last quarter vs the one before: median {q3:.0f} -> {q4:.0f} MB = {per_1000:+.1f} MB "
        f"per 1,000 steps; {'PASS' if flat else 'MISS'} no growth "
        f"(<= {SLOPE_LIMIT_MB:.0f} MB per 1,000 steps)"
    )
    print(f"malloc: {'glibc defaults' if args.default_malloc else 'arenas limited to 2'}")


if __name__ == "__main__":
    main()
