"""A LoRA run's first adapters read from a PEFT adapter folder (``model.lora.init_from``).

The folder is what `rl_core.training.exports.write_peft_adapter` writes, and what PEFT's
``save_pretrained`` writes for a Llama-family model::

    adapter_config.json           peft_type LORA, r, lora_alpha, ...
    adapter_model.safetensors     base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
                                  [r, in] and ...lora_B.weight [out, r]

Reading inverts the export: a PEFT module name comes back to the adapter key of the base
kernel it names (``blocks.0.attn.q``) through the base model's own names
(`rl_core.pretrained.weights.hf_name` of each targeted kernel), and ``lora_A`` /
``lora_B`` are transposed back to the trainer's ``a [in, r]`` / ``b [r, out]``. Everything
is checked against the run's base model and ``model.lora`` before one array is used, and
what differs is named in an `AdapterMismatch` (the worker reports it as the run's failure):

- rank: must equal ``model.lora.rank`` (an adapter of another rank is another
  parameterisation; the error says which rank to set);
- modules: every module the adapter trains must be among ``model.lora.targets`` and exist
  in the base (a module the targets name and the adapter lacks starts fresh, B = 0, which
  changes nothing: the run starts from the adapter's policy exactly);
- shapes: every tensor's against the base kernel's ``[in, out]``;
- alpha: taken as the adapter's. The policy is ``W + alpha/r * A @ B``; the run keeps its
  own ``model.lora.alpha`` for training and scales B by ``adapter_alpha / spec_alpha`` so
  the merged weights, hence the first policy, are the adapter's exactly.

PEFT options that change what a module computes (``use_rslora``, ``fan_in_fan_out``,
biases, ``modules_to_save``, DoRA) have no counterpart in the trainer and are refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rl_core.errors import UnsupportedSpec
from rl_core.training.lora import KNOWN_TARGETS, LoraConfig, targeted_kernels

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
FIELD = "model.lora.init_from"
_PREFIX = "base_model.model."


class AdapterMismatch(UnsupportedSpec):
    """The adapter ``model.lora.init_from`` names cannot start this run; says what differs."""

    def __init__(self, reason: str) -> None:
        super().__init__(FIELD, reason)


def read_peft_adapter(directory: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The adapter's config and its tensors (PEFT names, as stored)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            # The folder's name only: on a worker the path is its cache's, not the tenant's.
            raise AdapterMismatch(
                f"the adapter folder {directory.name!r} has no {path.name}; a PEFT adapter "
                f"folder holds {CONFIG_FILE} and {WEIGHTS_FILE}"
            )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterMismatch(f"{CONFIG_FILE} is not JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise AdapterMismatch(f"{CONFIG_FILE} is not a JSON object")
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise AdapterMismatch(f"{WEIGHTS_FILE} is not a safetensors file: {exc}") from exc
    return config, tensors


def _check_config(config: dict[str, Any], lora: LoraConfig) -> tuple[int, float]:
    """The adapter's (rank, alpha), once its options are ones the trainer computes too."""
    if config.get("peft_type") != "LORA":
        raise AdapterMismatch(f"peft_type is {config.get('peft_type')!r}; only LORA adapters load")
    for option, harmless in (
        ("use_rslora", False),
        ("fan_in_fan_out", False),
        ("use_dora", False),
        ("bias", "none"),
    ):
        if config.get(option, harmless) != harmless:
            raise AdapterMismatch(
                f"the adapter has {option}={config[option]!r}; rlaas trains plain LoRA "
                f"({option}={harmless!r})"
            )
    if config.get("modules_to_save"):
        raise AdapterMismatch(
            f"the adapter also saves whole modules {config['modules_to_save']}; "
            "rlaas starts from LoRA weights only"
        )
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterMismatch(f"{CONFIG_FILE} has r={rank!r}, not a positive rank")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not alpha > 0:
        raise AdapterMismatch(f"{CONFIG_FILE} has lora_alpha={alpha!r}, not a positive number")
    if rank != lora.rank:
        raise AdapterMismatch(
            f"the adapter has rank {rank}, model.lora.rank is {lora.rank}; set model.lora.rank "
            f"to {rank}"
        )
    return rank, float(alpha)


def initial_adapters(
    directory: Path, params: Any, lora: LoraConfig
) -> dict[str, dict[str, np.ndarray]]:
    """The adapters of the PEFT folder ``directory`` as the trainer holds them, checked
    against the base ``params`` and ``lora``: ``"blocks.0.attn.q" -> {"a", "b"}`` (numpy,
    float32; B scaled to ``lora.alpha``). Raises `AdapterMismatch` naming what differs."""
    from rl_core.pretrained.weights import hf_name

    config, tensors = read_peft_adapter(directory)
    rank, alpha = _check_config(config, lora)
    kernels = targeted_kernels(params, KNOWN_TARGETS)
    by_module = {
        _PREFIX + hf_name((*name.split("."), "kernel"))[0].removesuffix(".weight"): name
        for name in kernels
    }
    parts: dict[str, dict[str, np.ndarray]] = {}
    for key, value in tensors.items():
        module, _, part = key.removesuffix(".weight").rpartition(".")
        if part not in ("lora_A", "lora_B") or not key.endswith(".weight"):
            raise AdapterMismatch(f"{WEIGHTS_FILE} has {key!r}, not a lora_A/lora_B weight")
        if module not in by_module:
            raise AdapterMismatch(
                f"{WEIGHTS_FILE} has {key!r}, which names no projection of this base model "
                f"(it adapts {sorted(by_module)[0]!r} and the like); start from an adapter "
                "of the same base (model.source)"
            )
        parts.setdefault(by_module[module], {})[part] = value
    if not parts:
        raise AdapterMismatch(f"{WEIGHTS_FILE} holds no tensors")
    outside = sorted({name.rsplit(".", 1)[-1] for name in parts} - set(lora.targets))
    if outside:
        raise AdapterMismatch(
            f"the adapter trains {outside}, which model.lora.targets {list(lora.targets)} "
            "leaves out; add them to model.lora.targets"
        )
    factor = np.float32(alpha / lora.alpha)  # (alpha/r) A B == (spec_alpha/r) A (factor B)
    adapters: dict[str, dict[str, np.ndarray]] = {}
    for name, found in sorted(parts.items()):
        d_in, d_out = kernels[name].shape
        for part, want in (("lora_A", (rank, d_in)), ("lora_B", (d_out, rank))):
            if part not in found:
                raise AdapterMismatch(f"{WEIGHTS_FILE} has no {part} for {name}")
            if tuple(found[part].shape) != want:
                raise AdapterMismatch(
                    f"{name}'s {part} is {list(found[part].shape)}, this base model and rank "
                    f"need {list(want)}; start from an adapter of the same base (model.source)"
                )
        adapters[name] = {
            "a": np.ascontiguousarray(found["lora_A"].astype(np.float32).T),
            "b": np.ascontiguousarray(found["lora_B"].astype(np.float32).T * factor),
        }
    return adapters


__all__ = ["AdapterMismatch", "initial_adapters", "read_peft_adapter"]
