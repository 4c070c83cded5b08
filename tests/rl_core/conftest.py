"""Shared fixtures of the rl_core tests: the real tiny model on CPU is the test double."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flax import nnx

from rl_core.models import Model, ModelConfig
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.rollout.jax_engine import EngineConfig, JaxEngine


@pytest.fixture(scope="session")
def tokenizer() -> BuiltinTokenizer:
    return BuiltinTokenizer()


@pytest.fixture(scope="session")
def tiny_config(tokenizer: BuiltinTokenizer) -> ModelConfig:
    return ModelConfig.tiny(vocab_size=tokenizer.vocab_size)


@pytest.fixture
def tiny_model(tiny_config: ModelConfig) -> Model:
    return Model(tiny_config, rngs=nnx.Rngs(0))


@pytest.fixture(scope="session")
def engine(tokenizer: BuiltinTokenizer, tiny_config: ModelConfig) -> Iterator[JaxEngine]:
    """One engine (and its compiled programs) for the whole session; fixed 8-row batches."""
    model = Model(tiny_config, rngs=nnx.Rngs(0))
    config = EngineConfig(stop_ids=(tokenizer.eos_id, tokenizer.end_of_turn_id), batch_buckets=(8,))
    eng = JaxEngine(model, config=config)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def engine_model(engine: JaxEngine, tiny_config: ModelConfig) -> Model:
    """The model whose weights the session engine serves (same seed, same init)."""
    return Model(tiny_config, rngs=nnx.Rngs(0))
