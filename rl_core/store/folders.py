"""Folders in an object store, visible whole or not at all.

An object store has no rename, so a folder cannot appear at once as a local one does.
Instead a folder's *marker* object is written last and removed first: a folder is
complete exactly when its marker is there (a checkpoint's ``rlaas_checkpoint.json``, an
export's ``rlaas_export.json``). A writer that dies mid-upload leaves objects without a
marker, which no reader takes and the next upload of that folder replaces.

Locally a folder is written under a hidden name and renamed into place (`staging_dir`,
`publish_dir`), for the same rule on disk.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from rl_core.store.base import ArtifactStore, StoredObject, StoreError


def upload_folder(
    store: ArtifactStore,
    local: Path,
    prefix: str,
    *,
    marker: str,
    marker_data: bytes | None = None,
) -> int:
    """Upload the folder ``local`` to ``prefix/``, its marker last; return the bytes sent.

    The marker is ``local/marker`` when ``marker_data`` is None, else ``marker_data``. What
    was at ``prefix/`` before (the same step written again by a resumed attempt) is made
    invisible first (its marker deleted) and its objects that the new folder lacks removed.
    """
    local, prefix = Path(local), prefix.strip("/")
    files = sorted(p for p in local.rglob("*") if p.is_file())
    names = {p.relative_to(local).as_posix(): p for p in files}
    if marker_data is None and marker not in names:
        raise StoreError(f"{local} has no {marker}: not a complete folder to upload")
    marker_key = f"{prefix}/{marker}"
    old = [o.key for o in store.list(prefix)]
    if old:
        store.delete([marker_key])  # invisible from here until the new marker is written
        new_keys = {f"{prefix}/{n}" for n in names}
        store.delete([k for k in old if k not in new_keys and k != marker_key])
    sent = 0
    for name, path in names.items():
        if name == marker:
            continue
        store.put_file(f"{prefix}/{name}", path)
        sent += path.stat().st_size
    if marker_data is None:
        store.put_file(marker_key, names[marker])
        sent += names[marker].stat().st_size
    else:
        store.put_bytes(marker_key, marker_data)
        sent += len(marker_data)
    return sent


def complete_folders(
    store: ArtifactStore, prefix: str, *, marker: str
) -> dict[str, list[StoredObject]]:
    """The complete folders directly under ``prefix/``, by name, with their objects
    (the marker among them); one listing of the prefix."""
    prefix = prefix.strip("/")
    groups: dict[str, list[StoredObject]] = {}
    for obj in store.list(prefix):
        name, sep, _ = obj.key[len(prefix) + 1 :].partition("/")
        if sep:
            groups.setdefault(name, []).append(obj)
    return {
        name: objs
        for name, objs in groups.items()
        if any(o.key == f"{prefix}/{name}/{marker}" for o in objs)
    }


def folder_objects(store: ArtifactStore, prefix: str, *, marker: str) -> list[StoredObject] | None:
    """The objects of the folder at ``prefix/``, None unless it is complete."""
    prefix = prefix.strip("/")
    objs = store.list(prefix)
    if not any(o.key == f"{prefix}/{marker}" for o in objs):
        return None
    return objs


def download_folder(store: ArtifactStore, prefix: str, local: Path, *, marker: str) -> int:
    """Download the complete folder at ``prefix/`` to ``local`` (staged, then renamed into
    place over what was there); return the bytes fetched. `StoreError` if incomplete."""
    prefix = prefix.strip("/")
    objs = folder_objects(store, prefix, marker=marker)
    if objs is None:
        raise StoreError(f"{store.url.rstrip('/')}/{prefix} is not a complete folder (no {marker})")
    local = Path(local).absolute()
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = staging_dir(local)
    try:
        for obj in objs:
            store.download(obj.key, tmp / obj.key[len(prefix) + 1 :])
        publish_dir(tmp, local)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sum(o.size for o in objs)


def delete_folder(store: ArtifactStore, prefix: str, *, marker: str) -> None:
    """Delete the folder at ``prefix/``, its marker first (it is never seen half-deleted)."""
    prefix = prefix.strip("/")
    keys = [o.key for o in store.list(prefix)]
    marker_key = f"{prefix}/{marker}"
    if marker_key in keys:
        store.delete([marker_key])
    store.delete([k for k in keys if k != marker_key])


def staging_dir(target: Path) -> Path:
    """A hidden sibling of ``target`` to write into (not created), once the leftovers of
    earlier writes of it that crashed are gone: a folder is written there, then published."""
    for stale in target.parent.glob(f".tmp-{target.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return target.parent / f".tmp-{target.name}-{uuid.uuid4().hex[:8]}"


def publish_dir(tmp: Path, target: Path) -> None:
    """Move the written ``tmp`` into place as ``target`` by renames, so a reader sees the
    old folder or the new one, whole; an existing ``target`` goes only once ``tmp`` is in."""
    if target.exists():
        old = target.parent / f".tmp-{target.name}-old-{uuid.uuid4().hex[:8]}"
        target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(target)
