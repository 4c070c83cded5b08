"""`engine_config`: the prefix pool's default follows what a model's prefill costs."""

from __future__ import annotations

import pytest

from rl_core.models import ModelConfig
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.pipeline.configs import PREFIX_REUSE_FLOPS, engine_config
from rl_core.spec import parse_spec

# SmolLM2-135M-Instruct's shape (its weights are not needed to size the engine).
SMOLLM2 = ModelConfig(
    vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, d_ff=1536
)


def pool_on(model: ModelConfig, reuse: bool | None) -> bool:
    rollout = {} if reuse is None else {"prefix_reuse": reuse}
    spec = parse_spec({"environment": {"name": "guess_number"}, "rollout": rollout})
    config = engine_config(spec, BuiltinTokenizer(), model)
    return config.prefix_pool_rows != 0


def test_the_prefix_pool_is_on_by_default_for_a_real_model_and_off_for_the_tiny_presets() -> None:
    assert SMOLLM2.block_flops_per_token == pytest.approx(2 * 106.2e6, rel=0.01)
    assert SMOLLM2.block_flops_per_token > 10 * PREFIX_REUSE_FLOPS
    assert pool_on(SMOLLM2, None)
    for preset in (ModelConfig.tiny(), ModelConfig.small(), ModelConfig.tiny_alibi()):
        assert preset.block_flops_per_token < PREFIX_REUSE_FLOPS / 5
        assert not pool_on(preset, None)


@pytest.mark.parametrize("reuse", [True, False])
def test_a_spec_that_says_so_decides(reuse: bool) -> None:
    assert pool_on(SMOLLM2, reuse) is reuse
    assert pool_on(ModelConfig.tiny(), reuse) is reuse
