"""Turn a spec's ``model.source`` into a model and its tokenizer."""

from __future__ import annotations

import dataclasses

from flax import nnx

from rl_core.errors import UnsupportedModelSource
from rl_core.models.config import PRESETS
from rl_core.models.decoder import Model
from rl_core.spec import ModelSpec
from rl_core.tokenizer import BuiltinTokenizer, Tokenizer


def load_model(spec: ModelSpec, *, seed: int) -> tuple[Model, Tokenizer]:
    """Build the policy named by ``spec.source``; only random-init ``builtin:*`` presets so far."""
    if spec.kind != "builtin":
        raise UnsupportedModelSource(
            spec.source,
            f"model source kind {spec.kind!r} is not supported yet; use 'builtin:<preset>' "
            f"with a preset of {sorted(PRESETS)}",
        )
    preset = PRESETS.get(spec.location)
    if preset is None:
        raise UnsupportedModelSource(
            spec.source,
            f"unknown builtin preset {spec.location!r}; presets are {sorted(PRESETS)}",
        )
    tokenizer = BuiltinTokenizer()
    config = dataclasses.replace(preset(vocab_size=tokenizer.vocab_size), dtype=spec.dtype)
    return Model(config, rngs=nnx.Rngs(seed)), tokenizer
