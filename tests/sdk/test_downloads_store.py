"""Downloads streamed from the artifact store: the API on a real S3 server (moto's, on
loopback) with ``RLAAS_ARTIFACT_STORE`` set, as the worker uploads exports there; an
export whose upload died before its marker is a 404, not a cut archive; TensorBoard's
event files, copied there as a run goes, download for their tenant only."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import httpx
import pytest

from rl_core.artifacts import export_dir
from rl_core.store import open_store
from rl_core.store.folders import upload_folder
from rl_core.store.mirror import FolderMirror
from rl_core.training.stored import RunArtifacts, StoreTarget
from sdk.client import Client
from sdk.errors import NotFound
from tests.sdk.test_downloads import LORA_SPEC, checkpointed, exported, read_folder
from tests.web.live import live_api, migrated_database


def test_an_export_uploaded_to_s3_downloads_whole_and_a_partial_one_is_missing(
    postgres_url: str, s3_store_url: str, tmp_path: Path
) -> None:
    endpoint = os.environ["RLAAS_S3_ENDPOINT"]
    store = open_store(s3_store_url, endpoint=endpoint)
    with (
        live_api(
            migrated_database(postgres_url),
            artifacts_path=tmp_path / "not-used",  # the API reads the store, not a folder
            artifact_store=s3_store_url,
            s3_endpoint=endpoint,
        ) as live,
        Client(live.url, live.tenant()) as client,
    ):
        run_id = checkpointed(live, client, LORA_SPEC, [2, 4])
        worker = RunArtifacts(tmp_path / "worker", StoreTarget(store, run_id), keep=3)
        files = exported(
            export_dir(worker.run_dir, 4, "peft"),
            {
                "adapter_config.json": b'{"peft_type": "LORA", "r": 4}\n',
                "adapter_model.safetensors": os.urandom(3 * (1 << 20) // 2 + 7),
            },
        )
        worker.after_exports(4, ("hf", "peft"), lora=True)
        folder = client.download_checkpoint(run_id, format="peft", out=tmp_path / "adapter")
        assert read_folder(folder) == files  # the marker object stays out of the archive

        r = httpx.get(
            f"{live.url}/v1/runs/{run_id}/checkpoints/4/export",
            params={"format": "peft"},
            headers=client._http.headers,
        )
        assert r.status_code == 200 and int(r.headers["content-length"]) == len(r.content)
        (tmp_path / "a.tar").write_bytes(r.content)
        with tarfile.open(tmp_path / "a.tar") as tar:
            assert sorted(tar.getnames()) == [f"{run_id}-step-4-peft/{n}" for n in sorted(files)]

        # Step 2's upload died after its files, before its marker: not there.
        partial = exported(export_dir(worker.run_dir, 2, "peft"), {"adapter_config.json": b"{}"})
        for name in partial:
            store.put_file(
                f"{run_id}/exports/step-00000002/peft/{name}",
                export_dir(worker.run_dir, 2, "peft") / name,
            )
        with pytest.raises(NotFound, match="no peft export"):
            client.download_checkpoint(run_id, 2, format="peft", out=tmp_path / "b")
        # Once whole, it is.
        upload_folder(
            store,
            export_dir(worker.run_dir, 2, "peft"),
            f"{run_id}/exports/step-00000002/peft",
            marker="rlaas_export.json",
            marker_data=b"{}",
        )
        got = client.download_checkpoint(run_id, 2, format="peft", out=tmp_path / "c")
        assert read_folder(got) == partial


def test_tensorboard_files_the_worker_copied_to_s3_download_for_their_tenant_only(
    postgres_url: str, s3_store_url: str, tmp_path: Path
) -> None:
    """What `TensorboardFiles` copies to the store (`FolderMirror`, as a worker does at an
    interval and at the run's end) downloads through the API; a grown file is sent again;
    another tenant's client gets a 404, and a run with no TensorBoard tracker says so."""
    endpoint = os.environ["RLAAS_S3_ENDPOINT"]
    store = open_store(s3_store_url, endpoint=endpoint)
    spec = {**LORA_SPEC, "trackers": [{"kind": "tensorboard"}]}
    with (
        live_api(
            migrated_database(postgres_url),
            artifacts_path=tmp_path / "not-used",
            artifact_store=s3_store_url,
            s3_endpoint=endpoint,
        ) as live,
        Client(live.url, live.tenant()) as client,
        Client(live.url, live.tenant()) as stranger,
    ):
        run_id = client.create_run(spec).id
        with pytest.raises(NotFound, match="none has been written yet"):
            client.download_tensorboard(run_id, out=tmp_path / "early")
        local = tmp_path / "worker" / "tensorboard"
        files = exported(local, {"events.out.tfevents.1.host-a": os.urandom(5000)})
        mirror = FolderMirror(store, f"{run_id}/trackers/tensorboard")
        assert mirror.sync(local) == 1 and mirror.sync(local) == 0  # unchanged: nothing sent
        with (local / "events.out.tfevents.1.host-a").open("ab") as f:
            f.write(b"more steps")
        files["events.out.tfevents.1.host-a"] += b"more steps"
        assert mirror.sync(local) == 1

        got = client.download_tensorboard(run_id, out=tmp_path / "tb")
        assert read_folder(got) == files
        with pytest.raises(NotFound):
            stranger.download_tensorboard(run_id, out=tmp_path / "theirs")
        other = client.create_run(LORA_SPEC).id
        with pytest.raises(NotFound, match="names no tensorboard tracker"):
            client.download_tensorboard(other, out=tmp_path / "none")
