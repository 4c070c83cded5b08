"""P1 / packing: a long-tail batch's train step, packed against padded, in one process.

    nice -n 10 .venv/bin/python bench/p1_packing.py [--rows 16] [--median 180]
        [--sigma 1.0] [--cap 450] [--micro-batches 1] [--repeats 5] [--seed 0]

The real `Trainer` on ``builtin:tiny`` (random init, float32) with examples/
tiny-game.yaml's trainer settings (temperature 0.7, learning rate 0.003 cosine, clip
0.2 / 0.28, entropy bonus 0.05 under a floor of 0.15, two mini-batches, two epochs:
four updates a step), on one batch shaped like the long-tail workload's (B12u): ``--rows``
trajectories whose lengths are lognormal (median ``--median`` tokens, log-sd
``--sigma``, at least 20, at most ``--cap``), each a 16-token prompt then turns of a
6-token answer (trained) and a 9-token observation (not), padded as the pipeline pads a
train batch (quarter octaves of the longest row, `configs.TRAIN_LENGTH_BUCKET`).

``plain`` is ``TrainerConfig(pack=False)``: every row padded to the batch's length;
``packed`` the default (rl_core.training.packing). Each trainer takes one step first
(its compiles, timed apart), then the two alternate, ``--repeats`` rounds; reported: the
best and the median s/step, the positions the updates' forwards computed (rows x length,
summed over the four updates: `Trainer.last_layout`) and the first timed step's loss.
Both trainers start from the same weights and take the same steps on the same batch, so
the losses agree to float32 rounding: one computation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from rl_core.algorithms.grpo import GrpoConfig
from rl_core.models.buckets import quarter_bucket
from rl_core.pretrained.sources import load_model
from rl_core.spec import ModelSpec
from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

PROMPT, ANSWER, OBSERVATION = 16, 6, 9


def long_tail_batch(
    rows: int, median: float, sigma: float, cap: int, vocab: int, seed: int
) -> TrainBatch:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(median), sigma, size=rows), 20, cap).astype(int)
    tokens, masks = [], []
    for n in lengths:
        mask = np.zeros(n, np.float32)
        at = PROMPT
        while at < n:  # answer, observation, answer, ... cut at the row's length
            mask[at : at + ANSWER] = 1.0
            at += ANSWER + OBSERVATION
        tokens.append(rng.integers(3, vocab, size=n))
        masks.append(mask)
    behaviour = [-rng.uniform(0.5, 3.0, size=len(m)) * m for m in masks]
    return TrainBatch.pack(
        tokens,
        masks,
        behaviour,
        rng.normal(size=rows).tolist(),
        rows=rows,
        bucket=quarter_bucket,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--median", type=float, default=180.0)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--cap", type=int, default=450)
    parser.add_argument("--micro-batches", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    model, _ = load_model(ModelSpec(source="builtin:tiny"), seed=0)
    batch = long_tail_batch(
        args.rows, args.median, args.sigma, args.cap, model.config.vocab_size, args.seed
    )
    lengths = [int(np.flatnonzero(m).max()) + 1 for m in batch.loss_mask if m.any()]
    print(
        f"batch: {args.rows} rows x {batch.tokens.shape[1]}; "
        f"lengths to the last trained token {sorted(lengths)}; "
        f"trained tokens {int(batch.loss_mask.sum())}; load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    base = TrainerConfig(
        learning_rate=0.003,
        lr_schedule="cosine",
        total_steps=4 * (args.repeats + 1),
        mini_batches=2,
        epochs=2,
        micro_batches=args.micro_batches,
        temperature=0.7,
        grpo=GrpoConfig(clip_eps_high=0.28, entropy_coef=0.05, entropy_floor=0.15),
    )
    trainers = {
        "plain": Trainer(model, TrainerConfig(**{**base.__dict__, "pack": False})),
        "packed": Trainer(model, base),
    }
    compile_s: dict[str, float] = {}
    for name, trainer in trainers.items():
        start = time.perf_counter()
        trainer.train_step(batch)
        compile_s[name] = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name in trainers}
    losses: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, trainer in trainers.items():
            start = time.perf_counter()
            metrics = trainer.train_step(batch)
            times[name].append(time.perf_counter() - start)
            losses.setdefault(name, metrics["loss"])
    print(f"load after: {os.getloadavg()[0]:.1f}")
    print("| variant | positions / step | first step s | s/step best | median | rounds | loss |")
    print("|---|---|---|---|---|---|---|")
    for name, trainer in trainers.items():
        t = times[name]
        layout = trainer.last_layout
        print(
            f"| {name} | {layout['positions']:,} ({layout['packed']} of 4 packed) "
            f"| {compile_s[name]:.2f} | {min(t):.3f} | {statistics.median(t):.3f} "
            f"| {' '.join(f'{x:.2f}' for x in t)} | {losses[name]:.6f} |"
        )


if __name__ == "__main__":
    main()
