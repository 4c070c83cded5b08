"""Checkpoints of training state: Orbax arrays plus a JSON sidecar, written atomically.

One checkpoint is a folder ``<artifacts>/checkpoints/step-00000012/``::

    state/                  Orbax (tensorstore) arrays: trainable weights, optimiser
                            state, update count, the trainer's RNG key
    extra.json              the caller's JSON (the collector's position: the next task and
                            the tasks started but unfinished; episode seeds derive
                            from the run seed, so no collector RNG is kept)
    rlaas_checkpoint.json   written last: format, step, trainer layout; its presence
                            is what makes the folder a checkpoint

It is written under a hidden temporary name in the same parent and renamed
into place, so a crash mid-write leaves only a ``.tmp-*`` folder that
`latest_checkpoint` never picks up (and the next save clears).

Arrays are stored flat, keyed by their dotted pytree path
(``trainable.policy.blocks.0.attn.q.kernel.value``), so a restore into a
trainer of another shape fails naming the first path that differs instead of
deep inside Orbax. The frozen base weights (LoRA) and the KL reference are
the initial policy: they come from the spec's model source, not from here.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from rl_core.errors import RlCoreError
from rl_core.records import CheckpointRecord
from rl_core.store.folders import publish_dir, staging_dir
from rl_core.training.trainer_group import TrainerAPI

FORMAT = 1
MARKER = "rlaas_checkpoint.json"
_PREFIX = "step-"


class CheckpointError(RlCoreError):
    """A checkpoint that cannot be restored into this trainer; the message names why."""


def checkpoint_dir(artifacts_dir: Path, step: int) -> Path:
    return Path(artifacts_dir) / "checkpoints" / f"{_PREFIX}{step:08d}"


def _layout(trainer: TrainerAPI) -> dict[str, Any]:
    cfg = trainer.config
    return {
        "lora": None
        if cfg.lora is None
        else {"rank": cfg.lora.rank, "targets": list(cfg.lora.targets)},
        "value_head": cfg.ppo is not None,
    }


def _path_name(path: tuple[Any, ...]) -> str:
    parts = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
        else:
            parts.append(str(entry))
    return ".".join(parts)


def _flat(tree: Any) -> dict[str, Any]:
    return {_path_name(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def save_checkpoint(
    directory: Path, *, step: int, trainer: TrainerAPI, extra: Mapping[str, Any]
) -> CheckpointRecord:
    """Write the trainer's state and ``extra`` to ``directory`` atomically; return its record."""
    import orbax.checkpoint as ocp

    directory = Path(directory).absolute()
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        extra_text = json.dumps(dict(extra), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint extra must be JSON-serialisable: {exc}") from exc
    tmp = staging_dir(directory)
    tmp.mkdir()
    try:
        with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as ckptr:
            ckptr.save(tmp / "state", args=ocp.args.StandardSave(_flat(trainer.training_state())))
        (tmp / "extra.json").write_text(extra_text, encoding="utf-8")
        # "written" tells this write from another of the same step (a resumed attempt's):
        # a worker's cached copy is used for a resume only if it is the stored one.
        marker = {
            "format": FORMAT,
            "step": step,
            "layout": _layout(trainer),
            "written": uuid.uuid4().hex,
        }
        with (tmp / MARKER).open("w", encoding="utf-8") as f:
            json.dump(marker, f)
            f.flush()
            os.fsync(f.fileno())
        publish_dir(tmp, directory)  # saved again at the same step (a resumed attempt): replaced
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return CheckpointRecord(step=step, uri=str(directory), size_bytes=_size(directory))


def _local_path(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def read_marker(path: Path) -> dict[str, Any]:
    marker = path / MARKER
    if not marker.is_file():
        raise CheckpointError(
            f"{path} is not a complete checkpoint (no {MARKER}); "
            "resume from a folder written by save_checkpoint, e.g. latest_checkpoint(...)"
        )
    try:
        data: dict[str, Any] = json.loads(marker.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{marker} is corrupt: {exc}") from exc
    if data.get("format") != FORMAT:
        raise CheckpointError(f"{path} has checkpoint format {data.get('format')}, not {FORMAT}")
    return data


def restore_checkpoint(uri: str, *, trainer: TrainerAPI) -> tuple[int, dict[str, Any]]:
    """Load the state saved at ``uri`` into ``trainer``; return (step, extra)."""
    import orbax.checkpoint as ocp

    path = _local_path(uri)
    marker = read_marker(path)
    if marker["layout"] != _layout(trainer):
        raise CheckpointError(
            f"{uri} was written by a trainer with layout {marker['layout']}, this one is "
            f"{_layout(trainer)}; resume with the same model.lora and algorithm.name"
        )
    current = trainer.training_state()
    leaves, treedef = jax.tree_util.tree_flatten_with_path(current)
    names = [_path_name(p) for p, _ in leaves]
    target = {
        n: ocp.utils.to_shape_dtype_struct(leaf) for n, (_, leaf) in zip(names, leaves, strict=True)
    }
    with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as ckptr:
        try:
            stored = ckptr.metadata(path / "state").item_metadata
        except (FileNotFoundError, ValueError) as exc:
            raise CheckpointError(f"{uri}: the array store is missing or corrupt: {exc}") from exc
        tree = getattr(stored, "tree", stored) or {}
        for name in names:
            meta = tree.get(name)
            if meta is None:
                raise CheckpointError(f"{uri} has no array {name!r}; was it written by this model?")
            want = target[name]
            if tuple(meta.shape) != tuple(want.shape):
                raise CheckpointError(
                    f"{uri}: {name} has shape {list(meta.shape)}, the trainer's is "
                    f"{list(want.shape)}; resume with the model the checkpoint was trained from"
                )
        try:
            restored = ckptr.restore(path / "state", args=ocp.args.StandardRestore(target))
        except ValueError as exc:
            raise CheckpointError(f"{uri} does not fit this trainer: {exc}") from exc
    trainer.load_training_state(jax.tree_util.tree_unflatten(treedef, [restored[n] for n in names]))
    extra = json.loads((path / "extra.json").read_text(encoding="utf-8"))
    return int(marker["step"]), extra


def latest_checkpoint(artifacts_dir: Path) -> CheckpointRecord | None:
    """The newest complete checkpoint under ``artifacts_dir/checkpoints``, or None."""
    root = Path(artifacts_dir) / "checkpoints"
    if not root.is_dir():
        return None
    best: tuple[int, Path] | None = None
    for child in root.iterdir():
        if not (child.is_dir() and child.name.startswith(_PREFIX) and (child / MARKER).is_file()):
            continue
        try:
            step = int(read_marker(child)["step"])
        except (CheckpointError, KeyError, ValueError):
            continue  # unreadable marker: not a checkpoint to resume from
        if best is None or step > best[0]:
            best = (step, child)
    if best is None:
        return None
    return CheckpointRecord(step=best[0], uri=str(best[1].absolute()), size_bytes=_size(best[1]))


__all__ = [
    "CheckpointError",
    "checkpoint_dir",
    "latest_checkpoint",
    "restore_checkpoint",
    "save_checkpoint",
]
