"""Downloads of a checkpoint's export over the real API (uvicorn on loopback, real Postgres):
the route's tenant scoping and refusals, the SDK's ``download_checkpoint`` and the CLI.

The export folders are laid out as the worker leaves them (`rl_core.artifacts`); that the
files themselves load in transformers and PEFT with the trainer's logprobs is
tests/rl_core/training/test_exports.py. Here the bytes must arrive whole: a file of more
than one read (1 MiB) and sizes off the tar's 512-byte blocks.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from rl_core.artifacts import export_dir
from sdk.cli import cli
from sdk.client import Client
from sdk.downloads import unpack_export
from sdk.errors import NotFound, RlaasError, Unprocessable
from tests.web.live import LiveApi, Worker, live_api, migrated_database

LORA_SPEC: dict[str, Any] = {
    "environment": {"name": "guess_number"},
    "train": {"steps": 4},
    "model": {"source": "builtin:tiny", "lora": {"rank": 4}},
}
FULL_SPEC: dict[str, Any] = {"environment": {"name": "guess_number"}, "train": {"steps": 4}}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("artifacts")


@pytest.fixture(scope="module")
def live(postgres_url: str, artifacts: Path) -> Iterator[LiveApi]:
    with live_api(migrated_database(postgres_url), artifacts_path=artifacts) as running:
        yield running


def checkpointed(live: LiveApi, client: Client, spec: dict[str, Any], steps: list[int]) -> str:
    """A run whose worker reported checkpoints at ``steps``."""
    run_id = client.create_run(spec).id
    worker = Worker(live.url, run_id)
    worker.start()
    for step in steps:
        worker.post("artifacts", kind="checkpoint", step=step, uri=f"/ckpt/{run_id}/{step}")
    return run_id


def exported(folder: Path, files: dict[str, bytes]) -> dict[str, bytes]:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def read_folder(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_the_newest_checkpoints_adapter_downloads_whole(
    live: LiveApi, artifacts: Path, tmp_path: Path
) -> None:
    with Client(live.url, live.tenant()) as client:
        run_id = checkpointed(live, client, LORA_SPEC, [2, 4])
        files = exported(
            export_dir(artifacts / run_id, 4, "peft"),
            {
                "adapter_config.json": b'{"peft_type": "LORA", "r": 4}\n',
                "adapter_model.safetensors": os.urandom(3 * (1 << 20) // 2 + 7),
            },
        )
        folder = client.download_checkpoint(run_id, format="peft", out=tmp_path / "adapter")
        assert folder == tmp_path / "adapter" and read_folder(folder) == files
        assert not list(tmp_path.glob(".rlaas-download-*"))  # the temporary file is gone

        # The archive itself: one folder, its length announced before the first byte.
        r = httpx.get(
            f"{live.url}/v1/runs/{run_id}/checkpoints/4/export",
            params={"format": "peft"},
            headers=client._http.headers,
        )
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-tar"
        assert int(r.headers["content-length"]) == len(r.content)
        (tmp_path / "a.tar").write_bytes(r.content)
        with tarfile.open(tmp_path / "a.tar") as tar:
            assert sorted(tar.getnames()) == [f"{run_id}-step-4-peft/{n}" for n in sorted(files)]

        with pytest.raises(RlaasError, match="not an empty folder"):
            client.download_checkpoint(run_id, 4, format="peft", out=tmp_path / "adapter")


def test_refusals_name_what_to_change(live: LiveApi, artifacts: Path) -> None:
    with Client(live.url, live.tenant()) as client:
        lora_run = checkpointed(live, client, LORA_SPEC, [2, 4])
        full_run = checkpointed(live, client, FULL_SPEC, [3])
        exported(export_dir(artifacts / lora_run, 4, "hf"), {"config.json": b"{}"})
        exported(export_dir(artifacts / full_run, 3, "hf"), {"config.json": b"{}"})

        with pytest.raises(NotFound) as unknown:
            client.download_checkpoint(lora_run, 3, format="hf")
        assert unknown.value.field == "step" and "steps [2, 4]" in unknown.value.message

        with pytest.raises(Unprocessable) as no_adapter:
            client.download_checkpoint(full_run, 3, format="peft")
        assert no_adapter.value.field == "format" and "format=hf" in no_adapter.value.message

        with pytest.raises(NotFound) as not_made:  # step 2's worker made no export
            client.download_checkpoint(lora_run, 2, format="peft")
        assert not_made.value.field == "format" and "no peft export" in not_made.value.message

        # An older step of a LoRA run keeps its adapter, not a merged model (the newest only).
        exported(export_dir(artifacts / lora_run, 2, "peft"), {"adapter_config.json": b"{}"})
        with pytest.raises(NotFound) as older:
            client.download_checkpoint(lora_run, 2, format="hf")
        assert older.value.field == "format" and "newest checkpoint only" in older.value.message
        assert "step 4" in older.value.message and "format=peft" in older.value.message

        r = httpx.get(
            f"{live.url}/v1/runs/{lora_run}/checkpoints/4/export",
            params={"format": "zip"},
            headers=client._http.headers,
        )
        assert r.status_code == 422 and r.json()["error"]["field"] == "format"

    # Another tenant's run is not there at all, whatever the step.
    with Client(live.url, live.tenant()) as stranger:
        with pytest.raises(NotFound) as hidden:
            stranger.download_checkpoint(lora_run, 4, format="hf")
        assert hidden.value.field == "run_id"
        with pytest.raises(NotFound):
            stranger.download_checkpoint(lora_run, format="hf")  # its checkpoint list too


def test_rlaas_download_fills_the_folder_it_prints(
    live: LiveApi, artifacts: Path, tmp_path: Path
) -> None:
    key = live.tenant()
    with Client(live.url, key) as client:
        run_id = client.create_run(FULL_SPEC).id
    worker = Worker(live.url, run_id)
    worker.start()
    worker.post("artifacts", kind="checkpoint", step=5, uri=f"/ckpt/{run_id}/5")
    files = exported(
        export_dir(artifacts / run_id, 5, "hf"),
        {"config.json": b'{"model_type": "llama"}', "model.safetensors": os.urandom(1000)},
    )
    env = {"RLAAS_API_URL": live.url, "RLAAS_API_KEY": key}
    out = tmp_path / "model"
    done = CliRunner().invoke(cli, ["download", run_id, "--format", "hf", "-o", str(out)], env=env)
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() == str(out) and read_folder(out) == files
    refused = CliRunner().invoke(cli, ["download", run_id, "--format", "peft"], env=env)
    assert refused.exit_code == 2 and "model.lora" in refused.output

    # Downloaded: the tenant deletes the finished run's artifacts (a live one's: refused).
    live_refusal = CliRunner().invoke(cli, ["runs", "delete-artifacts", run_id], env=env)
    assert live_refusal.exit_code != 0 and "cancel it" in live_refusal.output
    worker.post("status", status="succeeded")
    done = CliRunner().invoke(cli, ["runs", "delete-artifacts", run_id], env=env)
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() == f"{run_id}  freed 0 bytes"
    assert not (artifacts / run_id).exists()
    gone = CliRunner().invoke(cli, ["download", run_id, "-o", str(tmp_path / "again")], env=env)
    assert gone.exit_code == 2 and "no checkpoint yet" in gone.output


def test_an_archive_unpacks_only_plain_files_inside_the_folder(tmp_path: Path) -> None:
    def archive(*members: tuple[str, bytes | None]) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                if data is None:  # a link to a file outside the folder
                    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                    tar.addfile(info)
                else:
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        return buffer.getvalue()

    # A name that climbs out lands inside, by its base name.
    out = unpack_export([archive(("run-step-1-hf/../../evil.json", b"{}"))], tmp_path / "a")
    assert read_folder(out) == {"evil.json": b"{}"} and not (tmp_path / "evil.json").exists()
    with pytest.raises(RlaasError, match="not a plain file"):
        unpack_export([archive(("run-step-1-hf/config.json", None))], tmp_path / "b")
    whole = archive(("run-step-1-hf/model.safetensors", os.urandom(5000)))
    with pytest.raises(RlaasError, match="damaged"):
        unpack_export([whole[:3000]], tmp_path / "c")  # a download cut short
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
