"""The adapter a run starts from (``model.lora.init_from``), fetched before training starts.

The control plane pinned ``run:<source>@<step>`` at submit (or the run names an uploaded
``adapter:<id>``); the worker fetches that checkpoint's PEFT export, or the upload, as a
tar (``GET /internal/runs/{id}/init-adapter``, behind the run's lease token, so any host
can) into a cache folder keyed by source (and step), and hands rl_core a local folder
(``file:<dir>``), so rl_core reads a folder and never the network. A ``file:`` in a
claimed spec is refused: through the service it would name a path on this worker's disk
(the control plane refuses it at submit too).
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import tarfile
import uuid
from pathlib import Path
from typing import Any, Protocol

import httpx

from rl_core.spec import parse_init_from
from worker.leased_fetch import LeasedFetch

_FILES = ("adapter_config.json", "adapter_model.safetensors")


class AdapterUnavailable(RuntimeError):
    """The pinned adapter could not be fetched (gone from the source run, or refused)."""


class AdapterSource(Protocol):
    def fetch(self, run_id: str, source_id: str, step: int | None) -> Path:
        """A local PEFT adapter folder: the source run's export at ``step``, or the uploaded
        adapter ``source_id`` (``step`` None)."""
        ...


class HttpAdapters:
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

    def fetch(self, run_id: str, source_id: str, step: int | None) -> Path:
        # A checkpoint's export is written once and an upload never replaced, so source and
        # step name the content.
        final = self._cache / (source_id if step is None else f"{source_id}-step-{step:08d}")
        if all((final / name).is_file() for name in _FILES):
            return final
        self._cache.mkdir(parents=True, exist_ok=True)
        return self._fetch.retrying(
            f"the adapter of {source_id}", lambda: self._download(run_id, final), AdapterUnavailable
        )

    def _download(self, run_id: str, final: Path) -> Path:
        part = self._cache / f".{uuid.uuid4().hex}"
        try:
            part.mkdir()
            self._fetch.stream_to(
                f"/internal/runs/{run_id}/init-adapter",
                part / "adapter.tar",
                lambda reason: AdapterUnavailable(f"model.lora.init_from: {reason}"),
            )
            folder = _unpacked(part / "adapter.tar", part / "files")
            shutil.rmtree(final, ignore_errors=True)  # an incomplete one from a crash
            folder.rename(final)
            return final
        finally:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(part)


def _unpacked(archive: Path, into: Path) -> Path:
    """The adapter's two files, out of the tar the control plane made (one folder of files),
    into ``into``; only regular files of those names are taken."""
    into.mkdir()
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            if member.isfile() and name in _FILES:
                source = tar.extractfile(member)
                assert source is not None  # a regular file's
                with source, (into / name).open("wb") as out:
                    shutil.copyfileobj(source, out)
    missing = [name for name in _FILES if not (into / name).is_file()]
    if missing:
        raise AdapterUnavailable(f"model.lora.init_from: the adapter fetched lacks {missing}")
    return into


def with_local_adapter(spec: dict[str, Any], run_id: str, source: AdapterSource) -> dict[str, Any]:
    """``spec`` with ``model.lora.init_from`` fetched and named as a local folder (``file:``);
    a spec without one unchanged."""
    model = spec.get("model")
    lora = model.get("lora") if isinstance(model, dict) else None
    value = lora.get("init_from") if isinstance(lora, dict) else None
    if not isinstance(value, str):
        return spec
    kind, source_id, step = parse_init_from(value)
    if kind == "file" or (kind == "run" and step is None):
        raise AdapterUnavailable(
            f"model.lora.init_from {value!r} was not pinned to a run's checkpoint by the "
            "control plane; submit the run again (through the service: run:<run_id>[@<step>])"
        )
    folder = source.fetch(run_id, source_id, step)
    out = copy.deepcopy(spec)
    out["model"]["lora"]["init_from"] = f"file:{folder}"
    return out
