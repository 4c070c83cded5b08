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
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

import httpx

from rl_core.protocol.datasets import procedural_task

log = logging.getLogger(__name__)

CHUNK = 1 << 16


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
        self._base = api_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {lease_token}"}
        self._cache = cache_dir
        self._retry_seconds = retry_seconds
        self._transport = transport

    def fetch(self, run_id: str, sha256: str) -> Path:
        final = self._cache / f"{sha256}.jsonl"
        if final.is_file():  # named by its hash, and moved in only once checked
            return final
        self._cache.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self._retry_seconds
        delay = 0.5
        while True:
            try:
                return self._download(run_id, sha256, final)
            except (httpx.TransportError, _Transient) as exc:
                if time.monotonic() + delay > deadline:
                    raise DatasetUnavailable(f"dataset {sha256}: gave up: {exc}") from exc
                log.warning("fetching dataset %s failed (%s); retrying", sha256, exc)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _download(self, run_id: str, sha256: str, final: Path) -> Path:
        url = f"{self._base}/internal/runs/{run_id}/datasets/{sha256}"
        tmp = final.with_name(f".{uuid.uuid4().hex}.part")
        digest = hashlib.sha256()
        try:
            with (
                httpx.Client(headers=self._headers, transport=self._transport, timeout=60) as http,
                http.stream("GET", url) as response,
            ):
                if response.status_code >= 500 or response.status_code == 429:
                    raise _Transient(f"HTTP {response.status_code}")
                if response.status_code != 200:
                    response.read()
                    raise DatasetUnavailable(
                        f"dataset {sha256}: HTTP {response.status_code}: {_message(response)}"
                    )
                with tmp.open("wb") as out:
                    for chunk in response.iter_bytes(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
            if digest.hexdigest() != sha256:
                raise DatasetUnavailable(
                    f"dataset {sha256}: the content fetched has SHA-256 {digest.hexdigest()}"
                )
            os.replace(tmp, final)
            return final
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


class _Transient(Exception):
    pass


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]


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
