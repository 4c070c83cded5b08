"""Hugging Face safetensors folders: the tiny models transformers saved, and broken copies."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rl_core.pretrained import (
    CheckpointSourceError,
    CorruptFileError,
    MissingTensorError,
    TensorShapeError,
    UnexpectedTensorError,
    UnsupportedConfigError,
    expected_tensor_shapes,
    load_checkpoint,
)
from tests.rl_core.pretrained.conftest import TinyModel


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_tiny_models_load_with_hf_names_shapes_and_values(
    arch: str, tiny_models: dict[str, TinyModel]
) -> None:
    model = tiny_models[arch]
    ckpt = load_checkpoint(f"hf:{model.path}")
    expected = expected_tensor_shapes(ckpt.config)
    assert list(ckpt.tensors) == list(expected)
    assert set(ckpt.tensors) == set(model.tensors)
    for name, value in ckpt.tensors.items():
        assert value.shape == expected[name], name
        assert np.array_equal(value, model.tensors[name]), name
    names = set(ckpt.tensors)
    assert ("model.layers.1.self_attn.q_proj.bias" in names) is (arch == "qwen2")
    assert ("model.layers.0.self_attn.o_proj.bias" in names) is False
    assert ("model.layers.1.self_attn.k_norm.weight" in names) is (arch == "qwen3")
    assert ("lm_head.weight" in names) is (arch == "llama")
    if arch == "qwen3":
        assert ckpt.tensors["model.layers.0.self_attn.q_proj.weight"].shape == (64, 32)


def test_llama_fixture_is_sharded_and_loads_whole(tiny_models: dict[str, TinyModel]) -> None:
    path = tiny_models["llama"].path
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and not (path / "model.safetensors").exists()
    ckpt = load_checkpoint(f"hf:{path}")
    assert len(ckpt.tensors) == len(index["weight_map"])
    assert ckpt.config.rope_scaling is not None and ckpt.config.rope_scaling.kind == "llama3"


def _rewrite(path: Path, edit: Callable[[dict[str, np.ndarray]], None]) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_missing_tensor_fails_naming_it(copy_model: Callable[[str], Path]) -> None:
    path = copy_model("qwen2")
    name = "model.layers.1.mlp.down_proj.weight"
    _rewrite(path / "model.safetensors", lambda t: t.pop(name))
    with pytest.raises(MissingTensorError, match=name.replace(".", r"\.")) as info:
        load_checkpoint(f"hf:{path}")
    assert info.value.name == name


def test_wrong_shape_fails_naming_the_tensor(copy_model: Callable[[str], Path]) -> None:
    path = copy_model("qwen3")
    name = "model.layers.0.self_attn.k_norm.weight"

    def edit(t: dict[str, np.ndarray]) -> None:
        t[name] = np.ones((8,), np.float32)

    _rewrite(path / "model.safetensors", edit)
    with pytest.raises(TensorShapeError, match=r"\[8\].*\[16\]") as info:
        load_checkpoint(f"hf:{path}")
    assert info.value.name == name


def test_unexpected_tensor_fails_naming_it(copy_model: Callable[[str], Path]) -> None:
    path = copy_model("qwen3")
    name = "model.layers.0.self_attn.o_proj.bias"

    def edit(t: dict[str, np.ndarray]) -> None:
        t[name] = np.zeros((32,), np.float32)

    _rewrite(path / "model.safetensors", edit)
    with pytest.raises(UnexpectedTensorError, match=name.replace(".", r"\.")):
        load_checkpoint(f"hf:{path}")


def test_truncated_shard_fails_naming_the_file(copy_model: Callable[[str], Path]) -> None:
    path = copy_model("llama")
    shard = sorted(path.glob("model-*.safetensors"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(CorruptFileError, match=shard.name):
        load_checkpoint(f"hf:{path}")


def test_index_naming_a_missing_shard_fails(copy_model: Callable[[str], Path]) -> None:
    path = copy_model("llama")
    shard = sorted(path.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(CheckpointSourceError, match=shard.name):
        load_checkpoint(f"hf:{path}")


def test_unknown_architecture_fails_before_reading_tensors(
    copy_model: Callable[[str], Path],
) -> None:
    path = copy_model("qwen2")
    config = json.loads((path / "config.json").read_text())
    config["model_type"] = "mixtral"
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"not read")
    with pytest.raises(UnsupportedConfigError, match="'model_type'"):
        load_checkpoint(f"hf:{path}")


def test_bfloat16_tensors_keep_their_dtype(copy_model: Callable[[str], Path]) -> None:
    import ml_dtypes

    path = copy_model("qwen2")
    _rewrite(
        path / "model.safetensors",
        lambda t: t.update({k: v.astype(ml_dtypes.bfloat16) for k, v in t.items()}),
    )
    ckpt = load_checkpoint(f"hf:{path}")
    assert {v.dtype for v in ckpt.tensors.values()} == {np.dtype(ml_dtypes.bfloat16)}
