"""The artifact store: the same calls on memory, a local folder and a real S3 server
(moto's, on loopback); folders visible whole or not at all; checkpoint retention."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_core.store import ObjectStore, StoreError, open_store
from rl_core.store.folders import complete_folders, download_folder, upload_folder
from rl_core.training.checkpointing import MARKER
from rl_core.training.stored import RunArtifacts, StoreTarget, folder_bytes, stored_steps


@pytest.fixture(params=["memory", "file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "memory":
        yield open_store("memory://")
    elif request.param == "file":
        yield open_store(f"file://{tmp_path / 'store'}")
    else:
        url = request.getfixturevalue("s3_store_url")
        yield open_store(url, endpoint=os.environ["RLAAS_S3_ENDPOINT"])


def folder(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_objects_round_trip_list_and_delete(store: ObjectStore, tmp_path: Path) -> None:
    big = os.urandom(3 << 20)
    (tmp_path / "big.bin").write_bytes(big)
    store.put_file("run/a/big.bin", tmp_path / "big.bin")
    store.put_bytes("run/a/small.json", b"{}")
    store.put_bytes("run/b/other", b"x")
    store.put_bytes("runner/not-under-run", b"x")
    assert [(o.key, o.size) for o in store.list("run/a")] == [
        ("run/a/big.bin", len(big)),
        ("run/a/small.json", 2),
    ]
    assert len(store.list("run")) == 3  # "runner/" is another prefix, not under "run/"
    assert b"".join(store.stream("run/a/big.bin", chunk_size=1 << 20)) == big
    store.download("run/a/big.bin", tmp_path / "out" / "big.bin")
    assert (tmp_path / "out" / "big.bin").read_bytes() == big
    assert store.get_bytes("run/a/small.json") == b"{}"
    assert store.get_bytes("run/a/missing") is None
    store.delete(["run/a/big.bin", "run/a/missing"])  # a missing key is no error
    assert [o.key for o in store.list("run/a")] == ["run/a/small.json"]
    with pytest.raises(StoreError, match=r"run/a/big\.bin"):
        b"".join(store.stream("run/a/big.bin"))


def test_a_folder_is_visible_only_once_its_marker_is_up(store: ObjectStore, tmp_path: Path) -> None:
    local = folder(tmp_path / "ckpt", {"state/a": b"1" * 100, "extra.json": b"{}", MARKER: b"m1"})

    class Interrupted(Exception):
        pass

    class DiesBeforeTheMarker:
        """The store, but the upload dies when the marker's turn comes (a SIGKILL there)."""

        url = store.url

        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

        def put_file(self, key: str, path: Path) -> None:
            if key.endswith(MARKER):
                raise Interrupted
            store.put_file(key, path)

    with pytest.raises(Interrupted):
        upload_folder(DiesBeforeTheMarker(), local, "run/checkpoints/step-00000002", marker=MARKER)  # type: ignore[arg-type]
    assert store.list("run/checkpoints")  # its files are there ...
    assert complete_folders(store, "run/checkpoints", marker=MARKER) == {}  # ... it is not
    with pytest.raises(StoreError, match="not a complete folder"):
        download_folder(store, "run/checkpoints/step-00000002", tmp_path / "x", marker=MARKER)

    upload_folder(store, local, "run/checkpoints/step-00000002", marker=MARKER)
    assert set(complete_folders(store, "run/checkpoints", marker=MARKER)) == {"step-00000002"}

    # Written again (a resumed attempt) with fewer files: the old ones go, the new are whole.
    again = folder(tmp_path / "again", {"state/b": b"2", MARKER: b"m2"})
    upload_folder(store, again, "run/checkpoints/step-00000002", marker=MARKER)
    got = download_folder(store, "run/checkpoints/step-00000002", tmp_path / "got", marker=MARKER)
    assert got == 3
    files = sorted(
        p.relative_to(tmp_path / "got").as_posix() for p in (tmp_path / "got").rglob("*")
    )
    assert files == [MARKER, "state", "state/b"]
    assert (tmp_path / "got" / MARKER).read_bytes() == b"m2"


def checkpoint(root: Path, step: int) -> Path:
    marker = {"format": 1, "step": step, "layout": {}, "written": f"w{step}"}
    return folder(
        root / "checkpoints" / f"step-{step:08d}",
        {"state/x": bytes([step]) * 10, MARKER: json.dumps(marker).encode()},
    )


def test_retention_keeps_the_newest_checkpoints_and_every_export(
    store: ObjectStore, tmp_path: Path
) -> None:
    from rl_core.records import CheckpointRecord

    run = RunArtifacts(tmp_path / "run", StoreTarget(store, "run-1", keep_cap=None), keep=2)
    for step in (3, 6, 9, 12):
        local = checkpoint(tmp_path / "run", step)
        record = run.after_save(CheckpointRecord(step=step, uri=str(local)), step)
        assert record.uri == f"{store.url.rstrip('/')}/run-1/checkpoints/step-{step:08d}"
        folder(tmp_path / "run" / "exports" / f"step-{step:08d}" / "peft", {"a.json": b"{}"})
        run.after_exports(step, ("hf", "peft"), lora=True)
        run.prune()
    assert stored_steps(store, "run-1") == [9, 12]
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == [
        "step-00000009",
        "step-00000012",
    ]
    assert not (tmp_path / "run" / "exports" / "step-00000012" / "peft").exists()  # uploaded
    for step in (3, 6, 9, 12):  # every step's adapter stays downloadable
        key = f"run-1/exports/step-{step:08d}/peft"
        assert {o.key.rsplit("/", 1)[1] for o in store.list(key)} == {"a.json", "rlaas_export.json"}

    # The quota counts what the store keeps (two checkpoints, four steps' exports), not
    # the worker's disk, which no longer holds the uploaded exports.
    kept = sum(o.size for sub in ("checkpoints", "exports") for o in store.list(f"run-1/{sub}"))
    assert run.kept_bytes() == kept > folder_bytes(tmp_path / "run")
    assert kept >= 2 * 10 + 4 * len(b"{}")

    # The operator's cap wins over the spec's number.
    capped = RunArtifacts(tmp_path / "run", StoreTarget(store, "run-1", keep_cap=1), keep=5)
    assert capped.keep == 1
    capped.prune()
    assert stored_steps(store, "run-1") == [12]


def test_a_fresh_disk_fetches_the_newest_checkpoint_and_reuses_its_cache(
    store: ObjectStore, tmp_path: Path
) -> None:
    from rl_core.records import CheckpointRecord

    writer = RunArtifacts(tmp_path / "host-a", StoreTarget(store, "run-2"), keep=3)
    for step in (4, 8):
        local = checkpoint(tmp_path / "host-a", step)
        writer.after_save(CheckpointRecord(step=step, uri=str(local)), step)
    reader = RunArtifacts(tmp_path / "host-b", StoreTarget(store, "run-2"), keep=3)
    latest = reader.latest()
    assert latest is not None and latest.step == 8
    got = Path(reader.resolve(latest.uri))
    assert got == tmp_path / "host-b" / "checkpoints" / "step-00000008"
    assert (got / "state" / "x").read_bytes() == bytes([8]) * 10
    (got / "state" / "x").write_bytes(b"cached")  # the same write: the cache is used as is
    assert (Path(reader.resolve(latest.uri)) / "state" / "x").read_bytes() == b"cached"
    (got / MARKER).write_text('{"written": "another attempt"}')  # another write: fetched
    assert (Path(reader.resolve(latest.uri)) / "state" / "x").read_bytes() == bytes([8]) * 10
    with pytest.raises(Exception, match="not a complete checkpoint in the store"):
        reader.resolve(f"{store.url}/run-2/checkpoints/step-00000005")


def test_a_bad_store_url_says_what_to_use() -> None:
    with pytest.raises(StoreError, match="s3://bucket/prefix"):
        open_store("/var/artifacts")
    with pytest.raises(StoreError, match="not supported"):
        open_store("ftp://host/x")
