"""Turn a spec's ``model.source`` into a model and its tokenizer.

``builtin:<preset>`` is a random-init preset with the builtin vocabulary; ``gguf:<path>``,
``hf:<dir>`` and ``pkg:<package>`` load a real checkpoint (`rl_core.pretrained`), whose
config, tensor names and shapes are all checked before any array reaches the device.
"""

from __future__ import annotations

import dataclasses

from flax import nnx

from rl_core.errors import UnsupportedModelSource
from rl_core.models.config import PRESETS, DType
from rl_core.models.decoder import Model
from rl_core.models.tokenizer import BuiltinTokenizer, Tokenizer
from rl_core.spec import ModelSpec


def load_model(spec: ModelSpec, *, seed: int) -> tuple[Model, Tokenizer]:
    """The policy named by ``spec.source``; raises an `RlCoreError` naming what is wrong."""
    if spec.kind in ("gguf", "hf", "pkg"):
        return load_pretrained(spec.source, dtype=spec.dtype)
    if spec.kind != "builtin":
        raise UnsupportedModelSource(
            spec.source,
            f"model source kind {spec.kind!r} is not supported; use builtin:, gguf:, hf: or pkg:",
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


def load_pretrained(source: str, *, dtype: DType = "float32") -> tuple[Model, Tokenizer]:
    """A real checkpoint (``gguf:``, ``hf:``, ``pkg:``) as a `Model` and a chat `Tokenizer`."""
    from rl_core.pretrained import load_checkpoint
    from rl_core.pretrained.chat_tokenizer import ChatTokenizer
    from rl_core.pretrained.hf_config import model_config
    from rl_core.pretrained.weights import model_from_tensors

    checkpoint = load_checkpoint(source)
    config = model_config(checkpoint.config, dtype=dtype)
    model = model_from_tensors(config, checkpoint.tensors, where=source)
    return model, ChatTokenizer(checkpoint.tokenizer, checkpoint.chat_template)
