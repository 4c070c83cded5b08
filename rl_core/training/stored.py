"""A run's checkpoints and exports in the artifact store, and their retention.

The worker's disk is a cache: Orbax writes a checkpoint there (`save_checkpoint`), then
`RunArtifacts.after_save` uploads it under ``<run>/checkpoints/step-NNNNNNNN/`` with its
``rlaas_checkpoint.json`` last, so the checkpoint is in the store whole or not at all
(`rl_core.store.folders`). A worker resuming the run on another host finds it missing
from its disk and downloads it (`resolve`) before restoring. Exports (hf, peft) follow
their checkpoint up, each with its ``rlaas_export.json`` marker last; the control plane
streams them from the store.

Without a store (the embedded default) the run's folder is the store itself: nothing is
uploaded, and retention prunes the folder alone.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from rl_core.artifacts import EXPORT_MARKER, ExportFormat, export_dir, export_key
from rl_core.records import CheckpointRecord
from rl_core.store.base import ArtifactStore, StoreError
from rl_core.store.folders import (
    complete_folders,
    delete_folder,
    download_folder,
    upload_folder,
)
from rl_core.training.checkpointing import MARKER, CheckpointError, checkpoint_dir

log = logging.getLogger(__name__)

_PREFIX = "step-"


@dataclass(frozen=True)
class StoreTarget:
    """Where the host keeps a run's artifacts: the store and the run's prefix in it, and
    the operator's cap on the checkpoints a run keeps (None: the spec's number)."""

    store: ArtifactStore | None
    prefix: str
    keep_cap: int | None = None


def folder_bytes(run_dir: Path) -> int:
    """The bytes of the checkpoints and exports in a run's folder on this host."""
    return sum(
        f.stat().st_size
        for sub in ("checkpoints", "exports")
        for f in (Path(run_dir) / sub).rglob("*")
        if f.is_file()
    )


def checkpoint_key(prefix: str, step: int) -> str:
    return f"{prefix.strip('/')}/checkpoints/{_PREFIX}{step:08d}"


def stored_steps(store: ArtifactStore, prefix: str) -> list[int]:
    """The steps of the run's complete checkpoints in the store, ascending."""
    folders = complete_folders(store, f"{prefix.strip('/')}/checkpoints", marker=MARKER)
    return sorted(step for name in folders if (step := _step(name)) is not None)


def _step(name: str) -> int | None:
    if not name.startswith(_PREFIX):
        return None
    try:
        return int(name.removeprefix(_PREFIX))
    except ValueError:
        return None


class RunArtifacts:
    """A run's folder on this worker (``run_dir``) and, with a store, its copy there."""

    def __init__(self, run_dir: Path, target: StoreTarget | None, *, keep: int) -> None:
        self.run_dir = Path(run_dir)
        self.store = target.store if target is not None else None
        self.prefix = target.prefix.strip("/") if target is not None else ""
        cap = target.keep_cap if target is not None else None
        self.keep = max(1, min(keep, cap) if cap is not None else keep)

    # --- writing -----------------------------------------------------------------

    def after_save(self, record: CheckpointRecord, step: int) -> CheckpointRecord:
        """Upload the checkpoint just written locally; its record then names the store."""
        if self.store is None:
            return record
        key = checkpoint_key(self.prefix, step)
        upload_folder(self.store, Path(record.uri), key, marker=MARKER)
        return dataclasses.replace(record, uri=f"{self.store.url.rstrip('/')}/{key}")

    def after_exports(self, step: int, formats: tuple[ExportFormat, ...], lora: bool) -> None:
        """Upload the checkpoint's exports that were made (a failed one is not there)."""
        if self.store is None:
            return
        for fmt in formats:
            folder = export_dir(self.run_dir, step, fmt)
            if not folder.is_dir():
                continue
            files = {
                p.relative_to(folder).as_posix(): p.stat().st_size
                for p in sorted(folder.rglob("*"))
                if p.is_file()
            }
            marker = json.dumps({"step": step, "format": fmt, "files": files}).encode()
            upload_folder(
                self.store,
                folder,
                export_key(self.prefix, step, fmt),
                marker=EXPORT_MARKER,
                marker_data=marker,
            )
            # Served from the store from now on: a full fine-tune's hf export per
            # checkpoint (each the model's size) would otherwise fill the worker's disk.
            shutil.rmtree(folder, ignore_errors=True)
        if lora:  # as on disk: a LoRA run keeps the merged export of its newest step only
            for old in self._stored_export_steps("hf"):
                if old < step:
                    delete_folder(
                        self.store, export_key(self.prefix, old, "hf"), marker=EXPORT_MARKER
                    )

    def _stored_export_steps(self, fmt: ExportFormat) -> list[int]:
        assert self.store is not None
        root = f"{self.prefix}/exports"
        steps = set()
        for obj in self.store.list(root):
            parts = obj.key[len(root) + 1 :].split("/")
            if len(parts) >= 2 and parts[1] == fmt and (s := _step(parts[0])) is not None:
                steps.add(s)
        return sorted(steps)

    def prune(self) -> list[int]:
        """Delete all but the newest ``keep`` checkpoints (store and disk); return the
        steps deleted. Exports are kept: they are what a tenant downloads."""
        deleted: set[int] = set()
        local = self._local_steps()
        for step in local[: -self.keep]:
            shutil.rmtree(checkpoint_dir(self.run_dir, step), ignore_errors=True)
            deleted.add(step)
        if self.store is not None:
            stored = stored_steps(self.store, self.prefix)
            for step in stored[: -self.keep]:
                delete_folder(self.store, checkpoint_key(self.prefix, step), marker=MARKER)
                deleted.add(step)
        if deleted:
            log.info("retention (keep %d): deleted checkpoints %s", self.keep, sorted(deleted))
        return sorted(deleted)

    def kept_bytes(self) -> int:
        """The bytes of the run's checkpoints and exports where they are kept: the store's
        copy (the worker's disk no longer holds the exports it uploaded), else the folder."""
        if self.store is None:
            return folder_bytes(self.run_dir)
        return sum(
            obj.size
            for sub in ("checkpoints", "exports")
            for obj in self.store.list(f"{self.prefix}/{sub}")
        )

    def _local_steps(self) -> list[int]:
        root = self.run_dir / "checkpoints"
        if not root.is_dir():
            return []
        steps = [
            s
            for child in root.iterdir()
            if (s := _step(child.name)) is not None and (child / MARKER).is_file()
        ]
        return sorted(steps)

    # --- reading -----------------------------------------------------------------

    def resolve(self, uri: str) -> str:
        """A local folder holding the checkpoint ``uri`` names (the claim's record): the
        cached copy when it is the stored one, else downloaded from the store first."""
        if self.store is None:
            return uri
        if "://" not in uri and (Path(uri) / MARKER).is_file():
            return uri  # recorded before the store was set, and on this disk: as before
        name = uri.rstrip("/").rsplit("/", 1)[-1]
        step = _step(name)
        if step is None:
            raise CheckpointError(f"{uri} names no checkpoint step ({_PREFIX}NNNNNNNN)")
        return str(self.fetch(step))

    def fetch(self, step: int) -> Path:
        """The checkpoint of ``step`` on this disk, downloaded unless the cache holds the
        very write the store holds (its marker's ``written`` id)."""
        assert self.store is not None
        key = checkpoint_key(self.prefix, step)
        local = checkpoint_dir(self.run_dir, step)
        stored_marker = self.store.get_bytes(f"{key}/{MARKER}")
        if stored_marker is None:
            raise CheckpointError(
                f"{self.store.url.rstrip('/')}/{key} is not a complete checkpoint in the store "
                "(no marker): it was deleted, or its upload never finished"
            )
        cached = local / MARKER
        if cached.is_file() and cached.read_bytes() == stored_marker:
            return local
        try:
            size = download_folder(self.store, key, local, marker=MARKER)
        except StoreError as exc:
            raise CheckpointError(str(exc)) from exc
        log.info("checkpoint of step %d: %.1f MB downloaded from the store", step, size / 1e6)
        return local

    def latest(self) -> CheckpointRecord | None:
        """The newest complete checkpoint in the store, downloaded to this disk; None when
        the store has none (a run resumed without the control plane's record)."""
        if self.store is None:
            return None
        steps = stored_steps(self.store, self.prefix)
        if not steps:
            return None
        local = self.fetch(steps[-1])
        size = sum(f.stat().st_size for f in local.rglob("*") if f.is_file())
        return CheckpointRecord(
            step=steps[-1],
            uri=f"{self.store.url.rstrip('/')}/{checkpoint_key(self.prefix, steps[-1])}",
            size_bytes=size,
        )


__all__ = ["RunArtifacts", "StoreTarget", "checkpoint_key", "stored_steps"]
