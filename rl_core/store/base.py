"""The artifact store's interface: keys are ``/``-separated paths under the store's root."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rl_core.errors import RlCoreError


class StoreError(RlCoreError):
    """The store could not be reached or refused an operation; the message names the key."""


@dataclass(frozen=True)
class StoredObject:
    key: str  # relative to the store's root, "/"-separated
    size: int
    mtime: float  # seconds since the epoch


class ArtifactStore(Protocol):
    """A flat key space of immutable objects (S3's model): no rename, no folders.

    A folder is written object by object; what makes one visible is a marker object
    written last (`rl_core.store.folders`), never the order a listing returns.
    """

    url: str  # where it is, for messages and records (no credentials)

    def put_file(self, key: str, path: Path) -> None:
        """Upload the file at ``path`` (in parts when large), replacing ``key``."""
        ...

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def get_bytes(self, key: str) -> bytes | None:
        """The object's bytes, None when there is none (for small objects: markers)."""
        ...

    def download(self, key: str, path: Path) -> None:
        """Write the object to ``path`` a chunk at a time (never whole in memory)."""
        ...

    def stream(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The object's bytes in chunks of about ``chunk_size``."""
        ...

    def list(self, prefix: str) -> list[StoredObject]:
        """Every object whose key starts with ``prefix/`` (all depths), sorted by key."""
        ...

    def delete(self, keys: Sequence[str]) -> None:
        """Delete ``keys``; a key that is not there is no error."""
        ...
