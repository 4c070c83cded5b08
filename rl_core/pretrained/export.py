"""Export a policy as a Hugging Face folder: config.json, model.safetensors, tokenizer files.

transformers (``AutoModelForCausalLM.from_pretrained``), vLLM and this package's own
``hf:`` loader read the result. Tensors are written in float32 under transformers' names
(`rl_core.pretrained.weights`); a tied model writes no ``lm_head.weight``. A LoRA-trained policy
is exported after its adapters are merged into the base weights (the trainer's job), so
the folder is a plain model.

::

    export_hf(model, "out/step-100", tokenizer=tokenizer)
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rl_core.models.config import ModelConfig
from rl_core.models.decoder import Model
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.pretrained.builtin_files import write_tokenizer_files
from rl_core.pretrained.chat_tokenizer import ChatTokenizer
from rl_core.pretrained.tokenizers_io import CheckpointTokenizer
from rl_core.pretrained.weights import model_to_tensors

_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def hf_config(
    config: ModelConfig,
    *,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> dict[str, Any]:
    """The ``config.json`` of a model (the ``rope_parameters`` layout of transformers >= 5)."""
    if config.alibi_slope:
        raise ValueError(
            f"alibi_slope={config.alibi_slope}: no Hugging Face family adds ALiBi to RoPE, "
            "so this model (builtin:tiny-alibi) cannot be exported; train it with the JAX engine"
        )
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling is not None:
        s = config.rope_scaling
        fields = {
            "rope_type": s.kind,
            "factor": s.factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "beta_fast": s.beta_fast,
            "beta_slow": s.beta_slow,
            "attention_factor": s.attention_factor,
            "mscale": s.mscale,
            "mscale_all_dim": s.mscale_all_dim,
        }
        rope.update({k: v for k, v in fields.items() if v is not None})
    out: dict[str, Any] = {
        "architectures": [_CLASSES[config.architecture]],
        "model_type": config.architecture,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.norm_eps,
        "rope_parameters": rope,
        "tie_word_embeddings": config.tie_embeddings,
        "attention_bias": False,
        "dtype": "float32",
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
    }
    if config.architecture == "qwen2":
        out["use_sliding_window"] = False  # Qwen2's q/k/v biases are implied by the type
    elif config.qkv_bias:
        raise ValueError(
            f"a {config.architecture} config cannot express q/k/v biases without an o_proj "
            "bias; export it as architecture 'qwen2'"
        )
    if config.qk_norm != (config.architecture == "qwen3"):
        raise ValueError(
            f"qk_norm={config.qk_norm} does not match architecture {config.architecture!r} "
            "(only qwen3 normalises queries and keys)"
        )
    return out


def export_hf(
    model: Model,
    directory: str | Path,
    *,
    tokenizer: ChatTokenizer | CheckpointTokenizer | BuiltinTokenizer | None = None,
    chat_template: str | None = None,
    untie: bool = False,
) -> Path:
    """Write ``directory`` (created; files replaced) and return it.

    ``untie`` writes a tied model as an untied one (``lm_head.weight`` a copy of the
    embedding; the same function): what vLLM must serve to reload weights in place,
    since its in-place reload skips a tied LM head and leaves the old one serving.
    """
    target = write_hf_folder(
        model.config, {}, directory, tokenizer=tokenizer, chat_template=chat_template, untie=untie
    )
    write_weights(model, target, untie=untie)
    return target


def write_hf_folder(
    config: ModelConfig,
    tensors: dict[str, np.ndarray],
    directory: str | Path,
    *,
    tokenizer: ChatTokenizer | CheckpointTokenizer | BuiltinTokenizer | None = None,
    chat_template: str | None = None,
    untie: bool = False,
) -> Path:
    """`export_hf` of a model given as ``tensors`` (HF names and layouts, `model_to_tensors`).

    Writes ``model.safetensors`` only when ``tensors`` is not empty: the exporter of a
    checkpoint (`rl_core.training.exports`) holds numpy arrays, not a `Model`. A builtin
    tokenizer is written as the files `rl_core.pretrained.builtin_files` makes of it.
    """
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    base = tokenizer.tokenizer if isinstance(tokenizer, ChatTokenizer) else tokenizer
    if isinstance(tokenizer, ChatTokenizer) and chat_template is None:
        chat_template = tokenizer.chat_template
    hf = hf_config(
        config,
        bos_token_id=base.bos_id if isinstance(base, CheckpointTokenizer) else None,
        eos_token_id=None if base is None else base.eos_id,
        pad_token_id=None if base is None else base.pad_id,
    )
    if untie:
        hf["tie_word_embeddings"] = False
    _write_json(target / "config.json", hf)
    if tensors:
        write_tensors(tensors, target, untie=untie)
    if isinstance(base, BuiltinTokenizer):
        write_tokenizer_files(base, target)
    elif base is not None:
        base.backend.save(str(target / "tokenizer.json"))
        tokenizer_config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **base.special_tokens,
        }
        if chat_template is not None:
            tokenizer_config["chat_template"] = chat_template
        _write_json(target / "tokenizer_config.json", tokenizer_config)
    return target


def write_weights(model: Model, directory: str | Path, *, untie: bool = False) -> Path:
    """Write only ``directory/model.safetensors`` (the folder is created) and return its path.

    What a server that already runs the architecture reloads in place (`VllmEngine`);
    ``untie`` as in `export_hf`. Atomic: a reader never sees a half-written file.
    """
    return write_tensors(model_to_tensors(model), directory, untie=untie)


def write_tensors(tensors: dict[str, np.ndarray], directory: str | Path, *, untie: bool) -> Path:
    """`write_weights` of ``tensors`` (HF names); atomic, as it."""
    from safetensors.numpy import save_file

    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target, suffix=".tmp", delete=False) as tmp:
        temp_path = Path(tmp.name)
    if untie and "lm_head.weight" not in tensors:
        tensors = {**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"].copy()}
    # safetensors writes an array's buffer as it lies: a Fortran-ordered one (numpy may
    # give ``W + delta.T`` that layout) would be read back transposed.
    tensors = {name: np.ascontiguousarray(array) for name, array in tensors.items()}
    save_file(tensors, str(temp_path), metadata={"format": "pt"})
    os.replace(temp_path, target / "model.safetensors")
    return target / "model.safetensors"


def weights_writer(model: Model, *, untie: bool = False) -> Callable[[Any, Path], Path]:
    """``write(params, directory)``: `write_weights` of ``model``'s structure holding ``params``.

    ``params`` is what the trainer hands the engine (`nnx.state` of a model of this
    structure). Lets an engine that imports no JAX (`VllmEngine`) publish new weights.
    """
    from flax import nnx

    graphdef = nnx.graphdef(model)

    def write(params: Any, directory: Path) -> Path:
        return write_weights(nnx.merge(graphdef, params), directory, untie=untie)

    return write


def logprob_scorer(model: Model) -> Callable[[Any, Sequence[int]], list[float]]:
    """``score(params, tokens)``: log p(tokens[t] | tokens[:t]) for t >= 1 ([T] -> [T-1]).

    Under ``params`` (`nnx.state` of a model of ``model``'s structure), in float32 and with
    no sampling filter: the reference a server's copy of the weights is checked against
    (`rl_core.rollout.vllm_engine.WeightCheck`). Compiled once per probe length.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    graphdef = nnx.graphdef(model)

    @jax.jit
    def logprobs(params: Any, tokens: jax.Array) -> jax.Array:  # tokens [1, T] -> [T-1]
        policy = nnx.merge(graphdef, params)
        positions = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
        logits, _ = policy(tokens, positions)
        logp = jax.nn.log_softmax(logits[0, :-1].astype(jnp.float32), axis=-1)
        return jnp.take_along_axis(logp, tokens[0, 1:, None], axis=-1)[:, 0]

    def score(params: Any, tokens: Sequence[int]) -> list[float]:
        row = jnp.asarray([list(tokens)], dtype=jnp.int32)
        return [float(x) for x in np.asarray(logprobs(params, row))]

    return score


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
