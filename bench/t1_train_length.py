"""T1: a train step packed at the run's context against its power-of-two bucket.

A run's rows never exceed ``agent.max_context`` (96 tokens in examples/reading-game.yaml
and tiny-game.yaml), but train batches used to be padded to the next power of two (128),
so a quarter of every train step's work was padding. This runs the example spec's own
trainer (model, optimiser, mini-batches, epochs) on one batch of rows of the example's
lengths, packed both ways, alternating, and reports each way's best wall time and the
process CPU time a step took (XLA's threads included). Same process, same batch.

    .venv/bin/python bench/t1_train_length.py                    # reading-game, 3 repeats
    .venv/bin/python bench/t1_train_length.py --spec examples/tiny-game.yaml --repeats 5
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", type=Path, default=Path("examples/reading-game.yaml"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    from rl_core.pipeline import configs
    from rl_core.pretrained.sources import load_model
    from rl_core.spec import load_spec
    from rl_core.training.trainer import TrainBatch, Trainer

    spec = load_spec(args.spec)
    model, tokenizer = load_model(spec.model, seed=spec.train.seed)
    trainer = Trainer(model, configs.trainer_config(spec))
    context = spec.agent.max_context
    rows = spec.batch_size
    rng = np.random.default_rng(0)
    # Lengths as the example's episodes have them: most near the context, some shorter.
    lengths = rng.integers(context * 2 // 3, context + 1, size=rows)
    tokens = [rng.integers(3, tokenizer.vocab_size, size=int(n)).tolist() for n in lengths]
    masks = [[0] * (len(t) // 3) + [1] * (len(t) - len(t) // 3) for t in tokens]
    logprobs = [[-2.0] * len(t) for t in tokens]
    advantages = rng.normal(size=rows).tolist()

    def batch(max_length: int | None) -> TrainBatch:
        return TrainBatch.pack(
            tokens, masks, logprobs, advantages, rows=rows, pad_id=tokenizer.pad_id,
            min_length=configs.TRAIN_MIN_LENGTH, max_length=max_length,
        )  # fmt: skip

    ways = {"bucket": batch(None), "context": batch(context)}
    for way in ways.values():
        trainer.train_step(way)  # compile
    wall: dict[str, list[float]] = {k: [] for k in ways}
    cpu: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(args.repeats):
        for name, way in ways.items():
            w, c = time.perf_counter(), time.process_time()
            trainer.train_step(way)
            wall[name].append(time.perf_counter() - w)
            cpu[name].append(time.process_time() - c)
    print(f"{args.spec.name}: {rows} rows, context {context}")
    for name, way in ways.items():
        print(
            f"  {name:8s} T={way.tokens.shape[1]:4d}  best {min(wall[name]):.2f} s  "
            f"cpu {np.median(cpu[name]):.2f} s/step"
        )
    print(f"  context/bucket best wall: {min(wall['context']) / min(wall['bucket']):.2f}")


if __name__ == "__main__":
    main()
