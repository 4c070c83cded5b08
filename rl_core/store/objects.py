"""`ArtifactStore` over obstore: S3 (and S3-compatible servers), a local folder, memory.

obstore was chosen over boto3 and fsspec/s3fs: one small wheel with no dependencies (a
worker already carries JAX; boto3 brings botocore's 20 MB of service models), a sync API
(the checkpointer runs in the device thread, not on an event loop), multipart uploads
and ranged streaming built in, and the same calls for S3, a local folder and memory, so
the embedded default and the unit tests run the code a deployment runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rl_core.store.base import StoredObject, StoreError

# Files above this go up in parts (S3's multipart upload), several at once.
_PART = 16 << 20


class ObjectStore:
    """An `ArtifactStore` over an obstore store (``obstore.store.S3Store``, ``LocalStore``,
    ``MemoryStore``)."""

    def __init__(self, store: Any, url: str) -> None:
        self._store, self.url = store, url

    def put_file(self, key: str, path: Path) -> None:
        import obstore

        try:
            obstore.put(self._store, key, Path(path), chunk_size=_PART)
        except Exception as exc:
            raise StoreError(f"uploading {path} to {self._where(key)} failed: {exc}") from exc

    def put_bytes(self, key: str, data: bytes) -> None:
        import obstore

        try:
            obstore.put(self._store, key, data)
        except Exception as exc:
            raise StoreError(f"writing {self._where(key)} failed: {exc}") from exc

    def get_bytes(self, key: str) -> bytes | None:
        import obstore

        try:
            return bytes(obstore.get(self._store, key).bytes())
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise StoreError(f"reading {self._where(key)} failed: {exc}") from exc

    def download(self, key: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with Path(path).open("wb") as f:
            for chunk in self.stream(key, chunk_size=_PART):
                f.write(chunk)

    def stream(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        import obstore

        try:
            result = obstore.get(self._store, key)
            for chunk in result.stream(min_chunk_size=chunk_size):
                yield bytes(chunk)
        except FileNotFoundError as exc:
            raise StoreError(f"{self._where(key)} is not in the store") from exc
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"reading {self._where(key)} failed: {exc}") from exc

    def list(self, prefix: str) -> list[StoredObject]:
        import obstore

        prefix = prefix.strip("/")
        try:
            found = [
                StoredObject(
                    key=str(meta["path"]),
                    size=int(meta["size"]),
                    mtime=meta["last_modified"].timestamp(),
                )
                for batch in obstore.list(self._store, prefix or None, chunk_size=1000)
                for meta in batch
            ]
        except FileNotFoundError:
            return []  # a local store whose folder is not made yet
        except Exception as exc:
            raise StoreError(f"listing {self._where(prefix)} failed: {exc}") from exc
        return sorted(found, key=lambda o: o.key)

    def delete(self, keys: Sequence[str]) -> None:
        import obstore

        if not keys:
            return
        try:
            # One request per 1,000 keys on S3; a local store deletes file by file.
            obstore.delete(self._store, list(keys))
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise StoreError(f"deleting under {self.url} failed: {exc}") from exc

    def _where(self, key: str) -> str:
        return f"{self.url.rstrip('/')}/{key}"


SCHEMES = ("s3", "file", "memory")


def check_store_url(url: str) -> str:
    """``url`` if it names a store `open_store` opens (no connection is made); else a
    `StoreError` saying what to write, for a setting checked at start-up."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise StoreError(
            f"artifact store {url!r} is not a URL; use s3://bucket/prefix, file:///folder "
            "or memory://"
        )
    if scheme not in SCHEMES:
        raise StoreError(
            f"artifact store {url!r}: scheme {scheme!r} is not supported; use s3://, file:// "
            "or memory://"
        )
    if scheme == "s3" and not rest.partition("/")[0]:
        raise StoreError(f"artifact store {url!r} names no bucket; use s3://bucket/prefix")
    return url


def open_store(url: str, *, endpoint: str | None = None) -> ObjectStore:
    """The store at ``url``: ``s3://bucket/prefix``, ``file:///folder`` or ``memory://``.

    S3 credentials and region come from the standard variables (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``), which obstore reads;
    ``endpoint`` names an S3-compatible server (MinIO, Ceph, R2, a test's moto), and an
    ``http://`` one is allowed plain HTTP.
    """
    from obstore.store import LocalStore, MemoryStore, S3Store

    scheme, _, rest = check_store_url(url).partition("://")
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        options: dict[str, Any] = {}
        if endpoint:
            options["endpoint"] = endpoint
        client: Any = {"allow_http": True} if endpoint and endpoint.startswith("http://") else None
        try:
            store = S3Store(
                bucket, prefix=prefix.strip("/") or None, client_options=client, **options
            )
        except Exception as exc:
            raise StoreError(f"artifact store {url!r}: {exc}") from exc
        return ObjectStore(store, url)
    if scheme == "file":
        folder = Path(rest)
        folder.mkdir(parents=True, exist_ok=True)
        return ObjectStore(LocalStore(folder), url)
    return ObjectStore(MemoryStore(), url)


def store_setting(value: str | None) -> str | None:
    """``RLAAS_ARTIFACT_STORE`` as the API's and the worker's settings take it: unset or
    empty is None (the artifacts folder is the store); a bad URL is a ``ValueError``
    naming the fix, so pydantic stops start-up naming the setting."""
    try:
        return None if not value else check_store_url(value)
    except StoreError as exc:
        raise ValueError(str(exc)) from exc
