"""The trainer's recomputed logprobs match the sampler's for the same tokens (float32).

The sampler prefills packed rows and decodes from its cache; the trainer runs a plain
forward: both presets, so ALiBi's distances agree on every path (`tiny-alibi`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from flax import nnx

from rl_core.models import Model, ModelConfig
from rl_core.models.config import PRESETS
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.jax_engine import EngineConfig, JaxEngine
from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig


@pytest.fixture(scope="module", params=["tiny", "tiny-alibi"])
def served(
    request: pytest.FixtureRequest, tokenizer: BuiltinTokenizer
) -> Iterator[tuple[JaxEngine, Model]]:
    """An engine serving a preset's random-init model, and the same weights to train."""
    config: ModelConfig = PRESETS[request.param](vocab_size=tokenizer.vocab_size)
    stops = (tokenizer.eos_id, tokenizer.end_of_turn_id)
    engine = JaxEngine(
        Model(config, rngs=nnx.Rngs(0)), config=EngineConfig(stop_ids=stops, batch_buckets=(8,))
    )
    yield engine, Model(config, rngs=nnx.Rngs(0))
    engine.close()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_mismatch_kl_is_zero_on_the_samplers_own_tokens(
    served: tuple[JaxEngine, Model], tokenizer: BuiltinTokenizer, temperature: float
) -> None:
    engine, engine_model = served
    texts = ["Guess the number between 1 and 8.", "higher", "Is it 3 or 4?", "lower", "5"]
    prompts = [
        tokenizer.render_messages([{"role": "user", "content": t}]) + tokenizer.assistant_prefix()
        for t in texts
    ]
    out = engine.generate_batch(
        prompts,
        max_new_tokens=12,
        sampling=SamplingParams(temperature=temperature),
        seeds=list(range(len(prompts))),
    )
    seqs = [p + c.tokens for p, c in zip(prompts, out, strict=True)]
    masks = [[0] * len(p) + [1] * len(c.tokens) for p, c in zip(prompts, out, strict=True)]
    lps = [[0.0] * len(p) + c.logprobs for p, c in zip(prompts, out, strict=True)]
    batch = TrainBatch.pack(seqs, masks, lps, [1.0, -1.0, 0.5, -0.5, 0.0], rows=8)

    trainer = Trainer(engine_model, TrainerConfig(temperature=temperature))
    recomputed = trainer.logprobs(batch.tokens)
    on = batch.loss_mask > 0
    np.testing.assert_allclose(recomputed[on], batch.logprobs[on], atol=1e-4)
    metrics = trainer.train_step(batch)
    assert 0.0 <= metrics["mismatch_kl"] < 1e-6
    worst = float(np.max(np.abs(recomputed[on] - batch.logprobs[on])))
    assert metrics["mismatch_max"] == pytest.approx(worst, abs=1e-5)
    assert metrics["mismatch_max"] < 1e-4
    assert metrics["importance_weight"] == pytest.approx(1.0, abs=1e-4)
