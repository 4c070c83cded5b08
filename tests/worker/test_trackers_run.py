"""A run with trackers, through the real control plane (uvicorn on loopback, real
PostgreSQL) and the worker's own ``execute_run``: its metrics reach a real MLflow
server per step, TensorBoard event files (copied to the artifact store too) and a W&B
offline run in its artifacts folder, and the trackers' counters are among the run's own
metrics. A spec with a credential in
it is refused with the field named, and the credential is not echoed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

# Imported here, on the main thread, as pytest collects: orbax's package imports its
# `test_utils` module, which pytest's assertion rewriting parses; first imported at the
# run's first checkpoint instead, in the trainer's thread while the trackers' threads
# imported theirs, two threads' `ast` work at once tripped CPython 3.11's "AST constructor
# recursion depth mismatch" (a check that is per interpreter, not per thread).
import orbax.checkpoint  # noqa: F401
import pytest

from tests.rl_core.host.test_trackers import tfrecords, wandb_history
from tests.web.live import WORKER_TOKEN, LiveApi, live_api, migrated_database
from worker.job import execute_run
from worker.settings import WorkerSettings


@pytest.fixture(scope="module")
def live(postgres_url: str) -> Iterator[LiveApi]:
    with live_api(migrated_database(postgres_url)) as running:
        yield running


def tiny_spec(trackers: list[dict[str, str]]) -> dict[str, object]:
    return {
        "model": {"source": "builtin:tiny"},
        "environment": {"name": "guess_number", "config": {"low": 1, "high": 3, "max_turns": 2}},
        "agent": {"max_turns": 2, "max_new_tokens": 4, "max_context": 64},
        "rollout": {"group_size": 2, "concurrency": 4},
        "algorithm": {"batch_groups": 2},
        "train": {"steps": 2, "trajectories_per_step": 0},
        "trackers": trackers,
    }


@pytest.mark.minutes(1)
def test_a_runs_metrics_reach_mlflow_tensorboard_and_wandb(
    live: LiveApi, mlflow_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboardX.proto.event_pb2 import Event

    experiment = f"rlaas-{uuid.uuid4().hex[:8]}"
    trackers = [
        {"kind": "mlflow", "tracking_uri": mlflow_url, "experiment": experiment},
        {"kind": "tensorboard"},
        {"kind": "wandb", "project": "rlaas-tests"},
    ]
    auth = {"Authorization": f"Bearer {live.tenant()}"}
    created = httpx.post(
        f"{live.url}/v1/runs", json={"spec": tiny_spec(trackers)}, headers=auth, timeout=30
    )
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    monkeypatch.delenv("RLAAS_BROKER_URL", raising=False)  # the embedded default: loopback ok
    monkeypatch.delenv("RLAAS_ENV_URL_ALLOWLIST", raising=False)
    for name, value in {
        "RLAAS_API_URL": live.url,
        "RLAAS_WORKER_TOKEN": WORKER_TOKEN,
        "RLAAS_DATA_DIR": str(tmp_path / "data"),
        "RLAAS_WORKER_ID": "worker-with-trackers",
        # An artifact store (a folder here; S3 in deployments): TensorBoard's files go there too.
        "RLAAS_ARTIFACT_STORE": f"file://{tmp_path / 'store'}",
    }.items():
        monkeypatch.setenv(name, value)
    settings = WorkerSettings()

    assert execute_run(run_id, settings) == "succeeded"

    # MLflow: one run, tagged with the rlaas run, each metric at steps 1 and 2.
    client = MlflowClient(tracking_uri=mlflow_url)
    (found,) = client.search_runs(
        [client.get_experiment_by_name(experiment).experiment_id],
        filter_string=f"tags.`rlaas.run_id` = '{run_id}'",
    )
    assert found.info.status == "FINISHED"
    history = client.get_metric_history(found.info.run_id, "reward/mean")
    assert sorted(m.step for m in history) == [1, 2]
    stored = httpx.get(f"{live.url}/v1/runs/{run_id}/metrics", headers=auth, timeout=30).json()
    reward = {p["step"]: p["value"] for p in stored["points"] if p["name"] == "reward/mean"}
    assert {m.step: m.value for m in history} == pytest.approx(reward)

    # TensorBoard and W&B: files in the run's artifacts folder, the same steps.
    folder = settings.artifacts_dir() / run_id / "trackers"
    (events,) = (folder / "tensorboard").glob("events.out.tfevents.*")
    tb_steps = {
        event.step
        for event in map(Event.FromString, tfrecords(events))
        if any(v.tag == "reward/mean" for v in event.summary.value)
    }
    assert tb_steps == {1, 2}
    # ... copied to the store as they were at the run's end, where the API reads them.
    stored_events = tmp_path / "store" / run_id / "trackers" / "tensorboard" / events.name
    assert stored_events.read_bytes() == events.read_bytes()
    (run_file,) = (folder / "wandb" / "wandb").glob(f"offline-run-*/run-{run_id}.wandb")
    rows = wandb_history(run_file)
    assert [row["_step"] for row in rows] == [1, 2]
    assert [row["reward/mean"] for row in rows] == pytest.approx([reward[1], reward[2]])

    # The run's own metrics say the trackers missed nothing.
    counters = {p["name"]: p["value"] for p in stored["points"] if p["name"].startswith("tracker/")}
    for kind in ("mlflow", "tensorboard", "wandb"):
        assert counters[f"tracker/{kind}/errors"] == 0
        assert counters[f"tracker/{kind}/dropped"] == 0


def test_a_spec_with_a_credential_is_refused_naming_the_field(live: LiveApi) -> None:
    auth = {"Authorization": f"Bearer {live.tenant()}"}
    for tracker, field, words in (
        ({"kind": "wandb", "api_key": "s3cr3t-value"}, "trackers.0.wandb", "WANDB_API_KEY"),
        (
            {"kind": "mlflow", "tracking_uri": "https://me:s3cr3t@mlflow.example.com"},
            "trackers.0.mlflow.tracking_uri",
            "MLFLOW_TRACKING_TOKEN",
        ),
    ):
        spec = tiny_spec([tracker])
        answer = httpx.post(f"{live.url}/v1/runs", json={"spec": spec}, headers=auth, timeout=30)
        assert answer.status_code == 422, answer.text
        assert field in answer.text and words in answer.text
        assert "s3cr3t" not in answer.text  # the error never echoes the credential
