"""Loading a Hugging Face safetensors folder into ``dict[str, np.ndarray]`` under HF names.

A folder holds either one ``model.safetensors`` or shards listed in
``model.safetensors.index.json`` (``{"weight_map": {tensor name: shard file}}``). Loading
happens in two passes: every file's header is read first (names, shapes, dtypes; a truncated
or foreign file fails here, naming the file), the whole set is checked against the
`ArchConfig`, and only then is tensor data read. Arrays keep the dtype they are stored in
(bfloat16 arrives as ``ml_dtypes.bfloat16``, which numpy and JAX both take).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, so safetensors can hand it out)
import numpy as np
from safetensors import SafetensorError, safe_open

from rl_core.pretrained.errors import (
    CheckpointSourceError,
    CorruptFileError,
    MissingTensorError,
    TensorDTypeError,
)
from rl_core.pretrained.hf_config import ArchConfig
from rl_core.pretrained.layout import Shape, check_tensor_shapes

SINGLE_FILE: Final = "model.safetensors"
INDEX_FILE: Final = "model.safetensors.index.json"
READABLE_DTYPES: Final = ("F32", "F16", "BF16")


def safetensors_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> the file that should hold it, from the index or the single file.

    For a single file the names are those in its header (read here).
    """
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as err:
            raise CorruptFileError(str(index), f"not a safetensors index ({err!r})") from err
        if not isinstance(weight_map, dict) or not weight_map:
            raise CorruptFileError(str(index), "'weight_map' is empty or not an object")
        return {str(name): directory / str(file) for name, file in weight_map.items()}
    single = directory / SINGLE_FILE
    if single.is_file():
        return dict.fromkeys(_read_header(single), single)
    raise CheckpointSourceError(str(directory), f"holds neither {SINGLE_FILE} nor {INDEX_FILE}")


def load_safetensors_dir(directory: str | Path, config: ArchConfig) -> dict[str, np.ndarray]:
    """All tensors of the folder, checked against ``config`` before any data is read."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointSourceError(str(directory), "is not a directory")
    owner = safetensors_files(directory)

    headers: dict[Path, dict[str, tuple[Shape, str]]] = {}
    for path in dict.fromkeys(owner.values()):
        if not path.is_file():
            listed = next(name for name, p in owner.items() if p == path)
            raise CheckpointSourceError(
                str(path), f"shard listed in {INDEX_FILE} (for {listed!r}) does not exist"
            )
        headers[path] = _read_header(path)

    shapes: dict[str, Shape] = {}
    for name, path in owner.items():
        if name not in headers[path]:
            raise MissingTensorError(name, [name], f"{path.name} (where {INDEX_FILE} puts it)")
        shape, dtype = headers[path][name]
        if dtype not in READABLE_DTYPES:
            raise TensorDTypeError(name, dtype, path.name, READABLE_DTYPES)
        shapes[name] = shape
    names = check_tensor_shapes(shapes, config, where=str(directory))

    tensors: dict[str, np.ndarray] = {}
    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(owner[name], []).append(name)
    for path, file_names in by_file.items():
        try:
            with safe_open(str(path), framework="numpy") as f:
                for name in file_names:
                    tensors[name] = f.get_tensor(name)
        except SafetensorError as err:
            raise CorruptFileError(str(path), f"cannot read tensor data ({err})") from err
    return {name: tensors[name] for name in names}


def _read_header(path: Path) -> dict[str, tuple[Shape, str]]:
    """Name -> (shape, safetensors dtype string) for every tensor in one file."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            out: dict[str, tuple[Shape, str]] = {}
            for name in f.keys():  # noqa: SIM118  (safe_open is not a Mapping)
                view = f.get_slice(name)
                out[name] = (tuple(int(n) for n in view.get_shape()), str(view.get_dtype()))
            return out
    except SafetensorError as err:
        raise CorruptFileError(str(path), f"not a readable safetensors file ({err})") from err
    except OSError as err:
        raise CorruptFileError(str(path), f"cannot be opened ({err})") from err
