"""Where a run's exports lie in its artifacts folder: one layout for the worker and the API.

A run's folder (``RLAAS_DATA_DIR/artifacts/<run>``) holds, beside its checkpoints::

    exports/step-00000012/hf/      config.json, model.safetensors, tokenizer files (merged)
    exports/step-00000012/peft/    adapter_config.json, adapter_model.safetensors (LoRA runs)

The worker writes each export once, after the checkpoint of that step, under a hidden
temporary name renamed into place (`rl_core.training.exports`): a folder that exists is
complete. The control plane streams it (``GET /v1/runs/{id}/checkpoints/{step}/export``).
Pure Python, so the control plane may import it (it imports no JAX).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

ExportFormat = Literal["hf", "peft"]
EXPORT_FORMATS: Final[tuple[ExportFormat, ...]] = ("hf", "peft")


# With an object store (docs/storage.md) an export folder is complete once this object,
# written after its files, is there (a store has no rename); it lists the files and sizes.
EXPORT_MARKER: Final = "rlaas_export.json"


def export_key(run_id: str, step: int, fmt: ExportFormat) -> str:
    """The key prefix of one export in the artifact store (the run's folder is its id)."""
    return export_dir(Path(run_id), step, fmt).as_posix()


def export_dir(run_dir: Path, step: int, fmt: ExportFormat) -> Path:
    """The folder of one export of the checkpoint at ``step`` of the run at ``run_dir``."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; use one of {EXPORT_FORMATS}")
    return Path(run_dir) / "exports" / f"step-{int(step):08d}" / fmt


# A Tinker model's saved training state (save_state: adapter, Adam moments, step count;
# `rl_core.training.slot_state` writes and reads it) is a folder of the store, complete
# once this marker, written last, is there. Each save is a folder of its own, under its
# tenant: ``tinker/<tenant id>/<checkpoint id>/``.
TINKER_STATE_MARKER: Final = "rlaas_tinker_state.json"


def tinker_state_key(tenant_id: str, checkpoint_id: str) -> str:
    """The key prefix of one saved Tinker state in the artifact store."""
    return f"tinker/{tenant_id}/{checkpoint_id}"


__all__ = [
    "EXPORT_FORMATS",
    "EXPORT_MARKER",
    "TINKER_STATE_MARKER",
    "ExportFormat",
    "export_dir",
    "export_key",
    "tinker_state_key",
]
