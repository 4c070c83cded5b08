"""A growing local folder copied to the store as it changes: files written in place by
a library (TensorBoard's event files), which no marker can make whole, only newer.

Each `sync` uploads the files whose size or modification time changed since the last
one, so an event file that grows by a step's scalars is sent again, and one that did not
change costs nothing. The store's copy is at most one sync behind the disk; a worker
killed between syncs loses what it wrote since the last (the tracker syncs at an
interval and at the run's end)."""

from __future__ import annotations

from pathlib import Path

from rl_core.store.base import ArtifactStore


class FolderMirror:
    """``folder``'s files kept under ``prefix/`` in ``store`` by `sync`."""

    def __init__(self, store: ArtifactStore, prefix: str) -> None:
        self.store, self.prefix = store, prefix.strip("/")
        self._sent: dict[Path, tuple[int, int]] = {}  # path -> (size, mtime_ns) uploaded

    def sync(self, folder: Path) -> int:
        """Upload what changed under ``folder``; return the files sent. Raises `StoreError`
        (what was sent before the failure stays recorded, the rest is sent next time)."""
        sent = 0
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            stat = path.stat()
            seen = (stat.st_size, stat.st_mtime_ns)
            if self._sent.get(path) == seen:
                continue
            self.store.put_file(f"{self.prefix}/{path.relative_to(folder).as_posix()}", path)
            self._sent[path] = seen
            sent += 1
        return sent


__all__ = ["FolderMirror"]
