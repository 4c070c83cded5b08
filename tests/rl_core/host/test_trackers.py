"""The three real trackers, each read back with its own ecosystem's reader: TensorBoard
event files (tensorboardX's protobufs), a W&B offline run (W&B's protobufs), a real
MLflow server (the ``mlflow`` client). Plus an MLflow that is down or refused."""

from __future__ import annotations

import json
import struct
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_core.host.trackers.base import TrackerError
from rl_core.host.trackers.mirror import MirrorConfig, TrackerMirror
from rl_core.host.trackers.mlflow_rest import MlflowRest
from rl_core.host.trackers.tensorboard_files import TensorboardFiles
from rl_core.host.trackers.wandb_log import records
from rl_core.host.trackers.wandb_offline import WandbOffline
from rl_core.protocol.addresses import Allowlist
from tests.mlflow_server import free_port

STEPS = [
    (step, {"loss": 1.0 / step, "reward/mean": step / 4, "time/step_s": 0.5}) for step in (1, 2, 3)
]


def tfrecords(path: Path) -> Iterator[bytes]:
    """The records of a TFRecord file: length (u64), its CRC, data, the data's CRC."""
    raw = path.read_bytes()
    pos = 0
    while pos < len(raw):
        (length,) = struct.unpack("<Q", raw[pos : pos + 8])
        yield raw[pos + 12 : pos + 12 + length]
        pos += 12 + length + 4


def test_tensorboard_event_files_hold_every_scalar_per_step(tmp_path: Path) -> None:
    from tensorboardX.proto.event_pb2 import Event

    tracker = TensorboardFiles(tmp_path / "tb")
    tracker.open()
    tracker.log(STEPS)
    tracker.close("succeeded")

    (events,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    scalars: dict[tuple[int, str], float] = {}
    for record in tfrecords(events):
        event = Event.FromString(record)
        for value in event.summary.value:
            scalars[(event.step, value.tag)] = value.simple_value
    want = {(step, name): value for step, values in STEPS for name, value in values.items()}
    assert scalars == pytest.approx(want)


def test_tensorboard_files_reach_the_store_at_most_once_a_minute_and_at_the_end(
    tmp_path: Path,
) -> None:
    from rl_core.store import open_store
    from rl_core.store.mirror import FolderMirror

    store = open_store("memory://")
    now = [0.0]
    tracker = TensorboardFiles(
        tmp_path / "tb",
        mirror=FolderMirror(store, "run-1/trackers/tensorboard"),
        clock=lambda: now[0],
    )
    tracker.open()

    def stored() -> dict[str, int]:
        return {o.key: o.size for o in store.list("run-1/trackers/tensorboard")}

    tracker.log(STEPS[:1])  # the first steps go at once: the tenant sees the run has begun
    first = stored()
    (events,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    assert first == {f"run-1/trackers/tensorboard/{events.name}": events.stat().st_size}
    now[0] = 30.0
    tracker.log(STEPS[1:])
    assert stored() == first  # within the minute: not sent again
    now[0] = 61.0
    tracker.log(STEPS[:1])
    assert stored() != first
    tracker.close("succeeded")  # the end: the store holds the file as on disk
    assert store.get_bytes(f"run-1/trackers/tensorboard/{events.name}") == events.read_bytes()
    assert tracker.upload_errors == 0


def wandb_history(run_file: Path) -> list[dict[str, float]]:
    """The history rows of a ``run-<id>.wandb`` file (W&B's protobuf records)."""
    rows = []
    for record in records(run_file):
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return rows


def test_a_wandb_offline_run_folder_holds_the_metrics_per_step(tmp_path: Path) -> None:
    tracker = WandbOffline(
        tmp_path / "wb", project="rlaas-tests", run_id="run_01ABC", config={"train": {"steps": 3}}
    )
    tracker.open()
    tracker.log(STEPS)
    tracker.close("succeeded")

    (run_file,) = (tmp_path / "wb" / "wandb").glob("offline-run-*-run_01ABC/run-run_01ABC.wandb")
    rows = wandb_history(run_file)
    assert [row["_step"] for row in rows] == [1, 2, 3]
    for row, (_, values) in zip(rows, STEPS, strict=True):
        assert {k: row[k] for k in values} == pytest.approx(values)


def test_a_wandb_run_is_whole_on_disk_when_close_returns_even_if_wandbs_core_is_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # W&B's core writes the file when it closes the run's stream, which `finish` asks for
    # without waiting; a loaded machine's core does it late (seen in CI: the header
    # alone). Here the request reaches the core a second late, every time.
    from wandb.sdk.lib.service.service_connection import ServiceConnection

    inform_finish = ServiceConnection.inform_finish

    def late(self: ServiceConnection, run_id: str) -> None:
        threading.Timer(1.0, inform_finish, (self, run_id)).start()

    monkeypatch.setattr(ServiceConnection, "inform_finish", late)
    tracker = WandbOffline(tmp_path / "wb", project="rlaas-tests", run_id="run_slow")
    tracker.open()
    tracker.log(STEPS)
    tracker.close("succeeded")

    (run_file,) = (tmp_path / "wb" / "wandb").glob("offline-run-*-run_slow/run-run_slow.wandb")
    assert [row["_step"] for row in wandb_history(run_file)] == [1, 2, 3]


def test_a_wandb_run_file_never_written_is_a_tracker_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wandb.sdk.lib.service.service_connection import ServiceConnection

    inform_finish = ServiceConnection.inform_finish
    asked: list[tuple[ServiceConnection, str]] = []
    monkeypatch.setattr(
        ServiceConnection, "inform_finish", lambda self, run_id: asked.append((self, run_id))
    )
    tracker = WandbOffline(
        tmp_path / "wb", project="rlaas-tests", run_id="run_stuck", write_timeout_s=0.5
    )
    tracker.open()
    tracker.log(STEPS)
    try:
        with pytest.raises(TrackerError, match=r"did not write the run's file .*run-run_stuck"):
            tracker.close("succeeded")
    finally:
        for connection, run_id in asked:  # let the core close the stream after all
            inform_finish(connection, run_id)


def test_an_mlflow_server_receives_each_metric_per_step_and_a_resume_continues_the_run(
    mlflow_url: str,
) -> None:
    from mlflow.tracking import MlflowClient

    experiment = f"rlaas-{uuid.uuid4().hex[:8]}"
    loopback = Allowlist.parse("loopback", embedded=False)
    first = MlflowRest(mlflow_url, experiment=experiment, run_id="run_A", allowlist=loopback)
    first.open()
    first.log(STEPS[:2])
    first.close("failed")  # the attempt died; the next one resumes the same rlaas run
    again = MlflowRest(mlflow_url, experiment=experiment, run_id="run_A", allowlist=loopback)
    again.open()
    again.log(STEPS[2:])
    again.close("succeeded")

    assert again.mlflow_run_id == first.mlflow_run_id
    client = MlflowClient(tracking_uri=mlflow_url)
    run = client.get_run(again.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run_A"
    assert run.data.tags["rlaas.run_id"] == "run_A"
    for name in ("loss", "reward/mean", "time/step_s"):
        history = client.get_metric_history(run.info.run_id, name)
        got = sorted((m.step, m.value) for m in history)
        assert [s for s, _ in got] == [step for step, _ in STEPS]
        assert [v for _, v in got] == pytest.approx([values[name] for _, values in STEPS])


def test_an_mlflow_server_that_is_down_is_a_failure_to_retry() -> None:
    tracker = MlflowRest(f"http://127.0.0.1:{free_port()}", experiment="e", run_id="run_B")
    with pytest.raises(TrackerError, match=r"MLflow at http://127\.0\.0\.1") as caught:
        tracker.open()
    assert not caught.value.permanent


def test_an_mlflow_address_the_allowlist_refuses_is_never_called() -> None:
    public_only = Allowlist.parse("public", embedded=False)
    tracker = MlflowRest(
        f"http://127.0.0.1:{free_port()}", experiment="e", run_id="run_C", allowlist=public_only
    )
    with pytest.raises(TrackerError, match="loopback address") as caught:
        tracker.open()
    assert caught.value.permanent


def test_the_mirror_keeps_tensorboard_going_while_mlflow_is_down(tmp_path: Path) -> None:
    down = MlflowRest(f"http://127.0.0.1:{free_port()}", experiment="e", run_id="run_D")
    files = TensorboardFiles(tmp_path / "tb")
    config = MirrorConfig(retries=1, backoff_s=0.001, backoff_max_s=0.001)
    mirror = TrackerMirror([down, files], config)
    for step, values in STEPS:
        mirror.submit(step, values)
    final = mirror.close("succeeded")

    assert final["tracker/mlflow/dropped"] == 3 and final["tracker/mlflow/errors"] >= 2
    assert final["tracker/tensorboard/dropped"] == 0
    assert final["tracker/tensorboard/errors"] == 0
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_a_named_mlflow_host_is_called_at_an_address_the_allowlist_checked(
    mlflow_url: str,
) -> None:
    from mlflow.tracking import MlflowClient

    # The server listens on 127.0.0.1 only; localhost may resolve to ::1 first, and a
    # refused connection moves the tracker to the next checked address.
    named = mlflow_url.replace("127.0.0.1", "localhost")
    loopback = Allowlist.parse("loopback", embedded=False)
    tracker = MlflowRest(
        named, experiment=f"rlaas-{uuid.uuid4().hex[:8]}", run_id="run_E", allowlist=loopback
    )
    for _ in range(3):
        try:
            tracker.open()
            break
        except TrackerError as exc:
            assert "ConnectError" in str(exc) and not exc.permanent
    tracker.log(STEPS[:1])
    tracker.close("succeeded")

    history = MlflowClient(tracking_uri=mlflow_url).get_metric_history(
        tracker.mlflow_run_id, "loss"
    )
    assert [(m.step, m.value) for m in history] == [(1, 1.0)]
