"""The trackers a spec's ``trackers`` section names, built for one run."""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path

from rl_core.host.trackers.base import Tracker
from rl_core.host.trackers.mlflow_rest import MlflowRest
from rl_core.host.trackers.tensorboard_files import TensorboardFiles
from rl_core.host.trackers.wandb_offline import WandbOffline
from rl_core.protocol.addresses import Allowlist
from rl_core.spec import JobSpec, MlflowSpec, TensorboardSpec, WandbSpec
from rl_core.store.base import ArtifactStore
from rl_core.store.mirror import FolderMirror


def build_trackers(
    spec: JobSpec,
    *,
    run_id: str,
    run_dir: Path,
    allowlist: Allowlist | None,
    store: ArtifactStore | None = None,
    store_prefix: str = "",
) -> list[Tracker]:
    """One tracker per entry of ``spec.trackers``; files go under ``run_dir/trackers``,
    and TensorBoard's are copied to ``store`` under ``store_prefix/trackers/tensorboard``
    (the run's prefix) when there is one.

    Nothing is opened here (no network, no files): each tracker opens on its mirror
    thread. Their libraries are imported here, on the caller's thread, before the run
    starts: wandb's import is about a second and thousands of modules, which would
    otherwise run beside the pipeline's threads as they import their own (under pytest,
    two threads' imports rewritten at once tripped CPython 3.11's AST recursion check).
    ``allowlist`` bounds where an MLflow server may be (None: anywhere, a single-user
    machine).
    """
    trackers: list[Tracker] = []
    folder = run_dir / "trackers"
    for entry in spec.trackers:
        if isinstance(entry, WandbSpec):
            _preload("wandb")
            config = spec.model_dump(mode="json", exclude={"trackers"})
            trackers.append(
                WandbOffline(
                    folder / "wandb",
                    project=entry.project,
                    run_id=run_id,
                    name=entry.name,
                    config=config,
                )
            )
        elif isinstance(entry, MlflowSpec):
            trackers.append(
                MlflowRest(
                    entry.tracking_uri,
                    experiment=entry.experiment,
                    run_id=run_id,
                    run_name=entry.run_name,
                    allowlist=allowlist,
                )
            )
        elif isinstance(entry, TensorboardSpec):
            _preload("tensorboardX")
            key = f"{store_prefix.strip('/')}/trackers/tensorboard"
            mirror = FolderMirror(store, key) if store is not None else None
            trackers.append(TensorboardFiles(folder / "tensorboard", mirror=mirror))
    return trackers


def _preload(module: str) -> None:
    # Missing: the tracker's open fails once, saying what to install (mirror._open).
    with contextlib.suppress(ImportError):
        importlib.import_module(module)


__all__ = ["build_trackers"]
