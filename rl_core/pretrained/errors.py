"""Typed errors of the checkpoint loaders.

Every expected failure of loading a checkpoint raises one of these, before any
compute, with a message that names the file, the config field or the tensor to
fix. They sit under the RL core's one error base, so a run that cannot load
its model fails with a readable ``type: message``.

::

    RlCoreError                         (rl_core.errors)
    └── CheckpointError                 anything wrong with a checkpoint
        ├── CheckpointSourceError       bad source string, missing file / folder / package
        ├── CorruptFileError            a file that cannot be parsed (truncated, not that format)
        ├── ConfigError                 config.json / GGUF metadata describe no model we build
        │   ├── MissingConfigFieldError   a required field is absent
        │   └── UnsupportedConfigError    a value we do not support (architecture, rope type...)
        ├── TensorError                 the tensors do not match the config
        │   ├── MissingTensorError        an expected tensor is absent
        │   ├── UnexpectedTensorError     a tensor the config does not explain
        │   ├── TensorShapeError          a tensor has the wrong shape
        │   └── TensorDTypeError          a tensor is stored in a dtype we do not read
        ├── TokenizerError              no tokenizer can be built from the checkpoint
        └── ChatTemplateError           the template does not compile, or raised while rendering
"""

from __future__ import annotations

from collections.abc import Sequence

from rl_core.errors import RlCoreError


class CheckpointError(RlCoreError):
    """Base class of every error raised on purpose by ``rl_core.pretrained``."""


class CheckpointSourceError(CheckpointError):
    """The source cannot be resolved: bad ``kind:`` prefix, a path that does not exist, ..."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"checkpoint source {source!r}: {reason}")
        self.source = source


class CorruptFileError(CheckpointError):
    """A file exists but cannot be read as what it claims to be."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path


class ConfigError(CheckpointError):
    """The config describes no model the loaders can build."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"config field {field!r}: {reason}")
        self.field = field


class MissingConfigFieldError(ConfigError):
    def __init__(self, field: str, where: str = "config") -> None:
        super().__init__(field, f"required but missing from {where}")


class UnsupportedConfigError(ConfigError):
    def __init__(self, field: str, value: object, supported: Sequence[str] | str) -> None:
        wanted = supported if isinstance(supported, str) else "one of " + ", ".join(supported)
        super().__init__(field, f"value {value!r} is not supported (supported: {wanted})")
        self.value = value


class TensorError(CheckpointError):
    """The tensors of a checkpoint do not match its config."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"tensor {name!r}: {reason}")
        self.name = name


class MissingTensorError(TensorError):
    def __init__(self, name: str, missing: Sequence[str], where: str) -> None:
        more = f" (and {len(missing) - 1} more missing)" if len(missing) > 1 else ""
        super().__init__(name, f"expected by the config but not found in {where}{more}")
        self.missing = tuple(missing)


class UnexpectedTensorError(TensorError):
    def __init__(self, name: str, unexpected: Sequence[str], where: str) -> None:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        super().__init__(
            name, f"found in {where} but the config has no place for it{more}; wrong architecture?"
        )
        self.unexpected = tuple(unexpected)


class TensorShapeError(TensorError):
    def __init__(
        self, name: str, expected: tuple[int, ...], actual: tuple[int, ...], where: str
    ) -> None:
        super().__init__(
            name, f"shape {list(actual)} in {where}, but the config implies {list(expected)}"
        )
        self.expected = expected
        self.actual = actual


class TensorDTypeError(TensorError):
    def __init__(self, name: str, dtype: str, where: str, supported: Sequence[str]) -> None:
        super().__init__(
            name, f"stored as {dtype} in {where}; readable dtypes are {', '.join(supported)}"
        )
        self.dtype = dtype


class TokenizerError(CheckpointError):
    """No tokenizer can be built from the checkpoint's files or metadata."""


class ChatTemplateError(CheckpointError):
    """The chat template failed to compile, or raised (``raise_exception``) while rendering."""
