"""A run's dataset content, fetched from the control plane before training starts.

A run whose environment is ``dataset`` names its upload by id and carries the content
hash the control plane pinned at submit (``environment.config.sha256``). The worker
fetches exactly that content and hands the environment a local path (``config.path``),
so the environment reads a file and never the network.

`DatasetSource` is the seam: `HttpDatasets` streams
``GET /internal/runs/{id}/datasets/{sha256}`` (behind the run's lease token, so it works
from any host) into a cache folder keyed by hash, checking the hash; an artifact store
(issue #32) can replace it with its own fetch.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import uuid
from pathlib import Path
from typing import Any, Protocol

import httpx

from rl_core.protocol.datasets import procedural_task
from worker.leased_fetch import LeasedFetch


class DatasetUnavailable(RuntimeError):
    """The pinned content could not be fetched, or came back with another hash."""


class DatasetSource(Protocol):
    def fetch(self, run_id: str, sha256: str) -> Path:
        """A local file holding exactly the content whose SHA-256 is ``sha256``."""
        ...


class HttpDatasets:
    def __init__(
        self,
        api_url: str,
        lease_token: str,
        cache_dir: Path,
        *,
        retry_seconds: float = 120.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._fetch = LeasedFetch(
            api_url, lease_token, retry_seconds=retry_seconds, transport=transport
        )
        self._cache = cache_dir

    def fetch(self, run_id: str, sha256: str) -> Path:
        final = self._cache / f"{sha256}.jsonl"
        if final.is_file():  # named by its hash, and moved in only once checked
            return final
        self._cache.mkdir(parents=True, exist_ok=True)
        return self._fetch.retrying(
            f"dataset {sha256}", lambda: self._download(run_id, sha256, final), DatasetUnavailable
        )

    def _download(self, run_id: str, sha256: str, final: Path) -> Path:
        tmp = final.with_name(f".{uuid.uuid4().hex}.part")
        digest = hashlib.sha256()
        try:
            self._fetch.stream_to(
                f"/internal/runs/{run_id}/datasets/{sha256}",
                tmp,
                lambda reason: DatasetUnavailable(f"dataset {sha256}: {reason}"),
                on_chunk=digest.update,
            )
            if digest.hexdigest() != sha256:
                raise DatasetUnavailable(
                    f"dataset {sha256}: the content fetched has SHA-256 {digest.hexdigest()}"
                )
            os.replace(tmp, final)
            return final
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


def with_local_dataset(spec: dict[str, Any], run_id: str, source: DatasetSource) -> dict[str, Any]:
    """``spec`` with its ``dataset`` environment's pinned content fetched and named by
    ``config.path``; any other spec (a procedural source's too) unchanged."""
    env = spec.get("environment")
    if not isinstance(env, dict) or env.get("name") != "dataset":
        return spec
    config = env.get("config") or {}
    if procedural_task(config.get("dataset")) is not None:
        return spec  # generated on the worker (rl_core.envs.procedural): nothing to fetch
    sha256 = config.get("sha256")
    if not isinstance(sha256, str):
        raise DatasetUnavailable(
            "the run's dataset has no pinned content (config.sha256); the control plane pins "
            "it at submit: submit the run again"
        )
    path = source.fetch(run_id, sha256)
    out = copy.deepcopy(spec)
    out["environment"]["config"]["path"] = str(path)
    return out
