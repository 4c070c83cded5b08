"""A checkpoint as a Hugging Face model (LoRA merged) or as a PEFT LoRA adapter.

::

    base, tokenizer = load_model(spec.model, seed=spec.train.seed)   # the initial policy
    export_checkpoint(ckpt_dir, out / "hf", "hf", base=base, tokenizer=tokenizer, lora=lora)
    export_checkpoint(ckpt_dir, out / "peft", "peft", base=base, tokenizer=tokenizer, lora=lora)

``hf`` is a folder transformers and vLLM load as a plain model: ``config.json``,
``model.safetensors`` (float32, transformers' names) and the tokenizer files when the
run's tokenizer has them. A LoRA run's adapters are merged into the base weights
(``W + alpha/r * A @ B``, as the trainer merges them).

``peft`` is the adapter alone, as PEFT saves one, for ``PeftModel.from_pretrained`` or a
server with LoRA (vLLM ``--enable-lora``)::

    adapter_config.json           peft_type LORA, r, lora_alpha, target_modules (q_proj, ...)
    adapter_model.safetensors     base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
                                  [r, in] and ...lora_B.weight [out, r], float32

PEFT scales by ``lora_alpha / r`` as the trainer does, and ``lora_A`` / ``lora_B`` are the
trainer's ``a [in, r]`` / ``b [r, out]`` transposed (torch's ``Linear`` stores ``[out, in]``).

Only the policy's arrays are read from the checkpoint (not the optimiser state), with no
device: the arrays come back as numpy and the merge is a numpy matmul. What a checkpoint
does not hold comes from the caller: the base weights of a LoRA run and the model's
structure (``base``: the run's initial policy, what its model source gives), and alpha
(the checkpoint's marker keeps rank and targets only; they are checked against ``lora``).
The output folder appears whole or not at all (written under a hidden name, then renamed).
An existing one is kept (a checkpoint's export is made once), except by `export_all`,
which the worker calls right after writing a checkpoint: it replaces the exports of an
earlier checkpoint at that step.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx

from rl_core.artifacts import EXPORT_FORMATS, ExportFormat, export_dir
from rl_core.models.decoder import Model
from rl_core.models.tokenizer import BuiltinTokenizer, Tokenizer
from rl_core.pretrained.chat_tokenizer import ChatTokenizer
from rl_core.pretrained.export import write_hf_folder
from rl_core.pretrained.tokenizers_io import CheckpointTokenizer
from rl_core.pretrained.weights import hf_name, model_to_tensors
from rl_core.store.folders import publish_dir, staging_dir
from rl_core.training.checkpointing import CheckpointError, read_marker
from rl_core.training.lora import LoraConfig

_POLICY = "trainable.policy."


def export_checkpoint(
    checkpoint: Path,
    out: Path,
    fmt: ExportFormat,
    *,
    base: Model,
    tokenizer: Tokenizer | None,
    lora: LoraConfig | None,
    base_name: str = "",
    arrays: dict[str, np.ndarray] | None = None,
    replace: bool = False,
) -> Path:
    """Write the ``fmt`` export of the checkpoint folder ``checkpoint`` to ``out``; return it.

    ``base_name`` goes into a PEFT adapter's ``base_model_name_or_path`` (the run's model
    source). ``arrays``: the checkpoint's policy arrays when the caller read them already
    (`export_all` reads them once for every format). An existing ``out`` is kept unless
    ``replace``. Raises `CheckpointError` naming what does not fit.
    """
    if fmt not in EXPORT_FORMATS:
        raise CheckpointError(f"unknown export format {fmt!r}; use one of {EXPORT_FORMATS}")
    out = Path(out)
    if out.is_dir() and not replace:
        return out  # made once
    marker = read_marker(Path(checkpoint))
    _check_lora(checkpoint, marker.get("layout", {}).get("lora"), lora)
    if fmt == "peft" and lora is None:
        raise CheckpointError(
            f"{checkpoint} trains all the model's weights (no model.lora): it has no adapter; "
            "export it as format 'hf'"
        )
    if arrays is None:
        arrays = policy_arrays(Path(checkpoint))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = staging_dir(out)
    try:
        if fmt == "hf":
            tensors = (
                _merged(base, arrays, lora) if lora is not None else _full(base, arrays, checkpoint)
            )
            files_tokenizer = (
                tokenizer
                if isinstance(tokenizer, ChatTokenizer | CheckpointTokenizer | BuiltinTokenizer)
                else None
            )
            write_hf_folder(base.config, tensors, tmp, tokenizer=files_tokenizer)
        else:
            assert lora is not None
            write_peft_adapter(_adapters(arrays), lora, tmp, base_name=base_name)
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def adapter_base_name(source: str) -> str:
    """What a PEFT adapter names as its base: the run's ``model.source``, but for a file
    source only the file's name. A worker resolves a tenant's ``hf:``/``gguf:`` path inside
    its models folder (`rl_core.spec.confine_model_source`), and no path of the worker's
    machine goes into what the tenant downloads."""
    kind, _, location = source.partition(":")
    return f"{kind}:{Path(location).name}" if kind in ("hf", "gguf") else source


def export_formats(lora: LoraConfig | None) -> tuple[ExportFormat, ...]:
    """The exports a run's checkpoints have: ``hf`` always, ``peft`` for a LoRA run."""
    return EXPORT_FORMATS if lora is not None else ("hf",)


def export_all(
    checkpoint: Path,
    run_dir: Path,
    step: int,
    *,
    base: Model,
    tokenizer: Tokenizer | None,
    lora: LoraConfig | None,
    base_name: str = "",
) -> list[Path]:
    """Every export of a run's checkpoint (`export_formats`), where `rl_core.artifacts` says.

    Called right after the checkpoint is written, so exports of an earlier checkpoint at
    this step (an attempt that died before reporting it, whose steps a resumed attempt
    trains again) are replaced: an export always belongs to the checkpoint beside it.
    """
    formats = export_formats(lora)
    arrays = policy_arrays(Path(checkpoint))
    made = [
        export_checkpoint(
            checkpoint,
            export_dir(run_dir, step, fmt),
            fmt,
            base=base,
            tokenizer=tokenizer,
            lora=lora,
            base_name=base_name,
            arrays=arrays,
            replace=True,
        )
        for fmt in formats
    ]
    if lora is not None:
        drop_older_merged(run_dir, step)
    return made


def drop_older_merged(run_dir: Path, step: int) -> None:
    """A LoRA run keeps the merged (``hf``) export of its newest checkpoint only.

    A merged SmolLM2 is 542 MB against its adapter's 7.4 MB, and checkpoints come by time,
    so one per checkpoint would fill the disk; an older step's adapter stays downloadable
    and merges onto the same base (docs/exports.md).
    """
    root = Path(run_dir) / "exports"
    for folder in root.glob("step-*/hf"):
        if int(folder.parent.name.removeprefix("step-")) < step:
            shutil.rmtree(folder, ignore_errors=True)


def write_peft_adapter(
    adapters: dict[str, dict[str, np.ndarray]], lora: LoraConfig, directory: Path, *, base_name: str
) -> Path:
    """PEFT's two files for ``adapters``: ``"blocks.0.attn.q" -> {"a": [in, r], "b": [r, out]}``."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    modules: set[str] = set()
    for name, ad in sorted(adapters.items()):
        weight, _ = hf_name((*name.split("."), "kernel"))
        module = weight.removesuffix(".weight")  # model.layers.0.self_attn.q_proj
        modules.add(module.rsplit(".", 1)[-1])
        key = f"base_model.model.{module}"
        tensors[f"{key}.lora_A.weight"] = np.ascontiguousarray(np.asarray(ad["a"], np.float32).T)
        tensors[f"{key}.lora_B.weight"] = np.ascontiguousarray(np.asarray(ad["b"], np.float32).T)
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "target_modules": sorted(modules),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,  # scale alpha / r, as rl_core.training.lora
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
    }
    (directory / "adapter_config.json").write_text(
        json.dumps(config, indent=2) + "\n", encoding="utf-8"
    )
    return directory


def _check_lora(checkpoint: Path, stored: dict[str, Any] | None, lora: LoraConfig | None) -> None:
    given = None if lora is None else {"rank": lora.rank, "targets": list(lora.targets)}
    if stored != given:
        raise CheckpointError(
            f"{checkpoint} was trained with LoRA {stored}, the export was asked with {given}; "
            "export with the run's own model.lora"
        )


def policy_arrays(checkpoint: Path) -> dict[str, np.ndarray]:
    """The policy's arrays of the checkpoint, keyed by their path under the policy, as numpy."""
    import orbax.checkpoint as ocp

    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
        try:
            stored = ckptr.metadata(checkpoint / "state").item_metadata
        except (FileNotFoundError, ValueError) as exc:
            raise CheckpointError(f"{checkpoint}: the array store is missing or corrupt") from exc
        tree = getattr(stored, "tree", stored) or {}
        wanted = {
            name: ocp.utils.to_shape_dtype_struct(meta)
            for name, meta in tree.items()
            if name.startswith(_POLICY)
        }
        if not wanted:
            raise CheckpointError(f"{checkpoint} holds no policy arrays ({_POLICY}*)")
        # Partial: the optimiser's state (twice the policy's size) is never read.
        restored = ckptr.restore(
            checkpoint / "state",
            args=ocp.args.PyTreeRestore(
                item=wanted,
                restore_args=ocp.checkpoint_utils.construct_restore_args(wanted),
                partial_restore=True,
            ),
        )
    return {name.removeprefix(_POLICY): np.asarray(value) for name, value in restored.items()}


def _adapters(arrays: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    adapters: dict[str, dict[str, np.ndarray]] = {}
    for name, value in arrays.items():
        module, _, part = name.rpartition(".")  # "blocks.0.attn.q", "a" | "b"
        adapters.setdefault(module, {})[part] = value
    return adapters


def _merged(base: Model, arrays: dict[str, np.ndarray], lora: LoraConfig) -> dict[str, np.ndarray]:
    """The base's tensors with ``W + scale * A @ B`` on each adapted projection (HF layout)."""
    tensors = model_to_tensors(base)
    for module, ad in _adapters(arrays).items():
        weight, _ = hf_name((*module.split("."), "kernel"))
        delta = np.asarray(ad["a"], np.float32) @ np.asarray(ad["b"], np.float32)  # [in, out]
        merged = tensors[weight] + np.float32(lora.scale) * delta.T  # [out, in]
        tensors[weight] = np.ascontiguousarray(merged)  # numpy may lay the sum out as delta.T
    return tensors


def _full(base: Model, arrays: dict[str, np.ndarray], checkpoint: Path) -> dict[str, np.ndarray]:
    """A full fine-tune's tensors: every parameter is in the checkpoint (HF names, layout)."""
    expected = {
        ".".join(str(p) for p in path) for path, _ in nnx.to_flat_state(nnx.state(base, nnx.Param))
    }
    found = {name.removesuffix(".value"): value for name, value in arrays.items()}
    if set(found) != expected:
        odd = sorted(set(found) ^ expected)[:3]
        raise CheckpointError(
            f"{checkpoint} does not hold this model's parameters (first differences: {odd}); "
            "export with the run's own model.source"
        )
    tensors = {}
    for path, value in found.items():
        name, transpose = hf_name(tuple(path.split(".")))
        array = np.asarray(value, np.float32)
        tensors[name] = np.ascontiguousarray(array.T if transpose else array)
    return tensors


__all__ = [
    "adapter_base_name",
    "export_all",
    "export_checkpoint",
    "export_formats",
    "write_peft_adapter",
]
