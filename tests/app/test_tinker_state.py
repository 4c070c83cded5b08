"""Saved state outlives its model worker: the official ``tinker`` SDK (0.38), unchanged,
against a real control plane (uvicorn, Postgres migrated by Alembic) with an S3 artifact
store (moto on loopback), and model workers as real processes (``python -m
worker.tinker_server``).

Tenant A trains a LoRA model two steps on worker 1, ``save_state``, and trains on three
more. Still on worker 1, ``load_state_with_optimizer`` into another model continues as A
did, and ``load_state`` (weights only) into a third starts Adam again. Then worker 1 is
SIGKILLed (no goodbye: its models are lost) and worker 2 starts, fresh: on it,
``create_training_client_from_state_with_optimizer`` runs the same next calls with the
same losses as A's uninterrupted ones (rtol 1e-4, as the two-tenant test), ending on A's
final weights (forward logprobs of a model made from A's last save);
``create_training_client_from_state`` (weights only) matches the weights-only load.
Tenant B gets 404 for A's path; a bad path, a base or rank that does not fit, get 400
naming the field. The RestClient lists, reads and deletes the saves, and their bytes come
and go in the tenant's artifact_bytes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from tinker import types

from tests.mlflow_server import stop_group
from tests.web.live import REPO, WORKER_TOKEN, live_api, migrated_database

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(3)]

BASE = "builtin:tiny"
TOKENS = [1, 5, 6, 7, 8, 9, 5, 6]
CE = types.Datum(
    model_input=types.ModelInput.from_ints(TOKENS[:-1]),
    loss_fn_inputs={
        "target_tokens": types.TensorData.from_numpy(np.array(TOKENS[1:], np.int64)),
        "weights": types.TensorData.from_numpy(np.linspace(0.5, 1.0, 7).astype(np.float32)),
    },
)
PROBE = types.Datum(
    model_input=types.ModelInput.from_ints([3, 1, 4, 1, 5]),
    loss_fn_inputs={
        "target_tokens": types.TensorData.from_numpy(np.array([1, 4, 1, 5, 9], np.int64)),
        "weights": types.TensorData.from_numpy(np.ones(5, np.float32)),
    },
)
REGISTERED = "registered with the control plane"


@contextlib.contextmanager
def model_worker(api_url: str, store: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m worker.tinker_server`` on a free port, registered with the API, with the
    API's artifact store (its credentials are in this process's environment)."""
    env = {
        **os.environ,
        "RLAAS_ARTIFACT_STORE": store,
        "RLAAS_API_URL": api_url,
        "RLAAS_WORKER_CREDENTIAL": WORKER_TOKEN,
        "RLAAS_TINKER_BASES": BASE,
        "RLAAS_TINKER_PORT": "0",
        "RLAAS_DATA_DIR": str(log.parent / log.stem),
        "PYTHONPATH": str(REPO),
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "worker.tinker_server"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while REGISTERED not in log.read_text(errors="replace"):
            assert process.poll() is None, f"the worker exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the worker did not register: {log.read_text()}"
            time.sleep(0.1)
        yield process
    finally:
        if process.poll() is None:
            stop_group(process)


def step(training: tinker.TrainingClient) -> float:
    loss = training.forward_backward([CE], "cross_entropy").result().metrics["loss:sum"]
    training.optim_step(types.AdamParams(learning_rate=0.05)).result()
    return float(loss)


def probe(training: tinker.TrainingClient) -> np.ndarray:
    out = training.forward([PROBE], "cross_entropy").result()
    return np.asarray(out.loss_fn_outputs[0]["logprobs"].to_numpy())


def field_of(refusal: tinker.APIStatusError) -> str:
    body = refusal.body
    assert isinstance(body, dict), body
    return str(body["error"]["field"])


def artifact_bytes(api_url: str, key: str) -> int:
    limits = httpx.get(f"{api_url}/v1/limits", headers={"Authorization": f"Bearer {key}"})
    limits.raise_for_status()
    return int(limits.json()["usage"]["artifact_bytes"])


def test_a_saved_state_trains_on_in_a_fresh_worker_after_the_first_was_killed(
    postgres_url: str, s3_store_url: str, s3_endpoint: str, tmp_path: Path
) -> None:
    database = migrated_database(postgres_url)
    with (
        live_api(database, artifact_store=s3_store_url, s3_endpoint=s3_endpoint) as api,
        contextlib.ExitStack() as clients,  # closed first: sessions finished, heartbeats off
    ):
        key_a, key_b = api.tenant(), api.tenant()
        service = clients.enter_context(
            tinker.ServiceClient(base_url=api.url, api_key=f"tml-{key_a}")
        )
        service_b = clients.enter_context(
            tinker.ServiceClient(base_url=api.url, api_key=f"tml-{key_b}")
        )
        rest = tinker.RestClient(base_url=api.url, api_key=f"tml-{key_a}")
        rest_b = tinker.RestClient(base_url=api.url, api_key=f"tml-{key_b}")

        with model_worker(api.url, s3_store_url, tmp_path / "worker1.log") as first:
            a = service.create_lora_training_client(base_model=BASE, rank=4, seed=0).result()
            before = [step(a) for _ in range(2)]
            path = a.save_state("mid", user_metadata={"note": "two steps"}).result().path
            assert path == f"tinker://{a.model_id}/weights/mid"
            continued = [step(a) for _ in range(3)]
            assert continued[-1] < before[0]  # it learns
            end = a.save_state("end").result().path

            # Into models that exist, on this worker: with the optimizer it goes on as A
            # did; weights only, Adam starts again (the SDK's documented load_state).
            d = service.create_lora_training_client(base_model=BASE, rank=4, seed=6).result()
            step(d)  # a history of its own, which the load replaces
            d.load_state_with_optimizer(path).result()
            with_optimizer = [step(d) for _ in range(3)]
            c = service.create_lora_training_client(base_model=BASE, rank=4, seed=5).result()
            c.load_state(path).result()
            weights_only = [step(c) for _ in range(3)]
            first.kill()  # SIGKILL: the models on it are gone, it never deregisters
            first.wait()

        np.testing.assert_allclose(with_optimizer, continued, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(weights_only[0], continued[0], rtol=1e-4)
        assert abs(weights_only[1] - continued[1]) > 1e-3 * abs(continued[1])

        with model_worker(api.url, s3_store_url, tmp_path / "worker2.log"):
            resumed = service.create_training_client_from_state_with_optimizer(path).result()
            assert resumed.get_info().lora_rank == 4
            np.testing.assert_allclose(
                [step(resumed) for _ in range(3)], continued, rtol=1e-4, atol=1e-5
            )
            # Its weights are A's at its last save, which this worker loads too.
            a_end = service.create_training_client_from_state(end).result()
            np.testing.assert_allclose(probe(resumed), probe(a_end), rtol=1e-4, atol=1e-5)
            fresh = service.create_training_client_from_state(path).result()
            np.testing.assert_allclose(
                [step(fresh) for _ in range(3)], weights_only, rtol=1e-4, atol=1e-5
            )

            # Another tenant's path is as one never saved.
            with pytest.raises(tinker.NotFoundError):
                service_b.create_training_client_from_state(path).result()
            b = service_b.create_lora_training_client(base_model=BASE, rank=4).result()
            with pytest.raises(tinker.NotFoundError):
                b.load_state(path).result()
            with pytest.raises(tinker.NotFoundError):
                rest_b.delete_checkpoint_from_tinker_path(path).result()
            # Bad paths, and a base or rank the state does not fit: 400 naming the field.
            sampler_path = f"tinker://{a.model_id}/sampler_weights/x"
            for bad in ("s3://bucket/state", f"tinker://{a.model_id}/weights", sampler_path):
                with pytest.raises(tinker.BadRequestError) as refused:
                    service.create_training_client_from_state(bad).result()
                assert field_of(refused.value) == "path"
            with pytest.raises(tinker.BadRequestError, match="saved on") as refused:
                service.create_training_client_from_state(path, base_model="builtin:x").result()
            assert field_of(refused.value) == "base_model"
            rank2 = service.create_lora_training_client(base_model=BASE, rank=2).result()
            with pytest.raises(tinker.BadRequestError, match="rank-4 LoRA") as refused:
                rank2.load_state_with_optimizer(path).result()
            assert field_of(refused.value) == "path"
            # A name saved once is not replaced unless asked.
            twice = fresh.save_state("twice").result().path
            with pytest.raises(tinker.BadRequestError, match="overwrite") as refused:
                fresh.save_state("twice").result()
            assert field_of(refused.value) == "path"

        # The RestClient's view of the saves, and their bytes in artifact_bytes.
        listed = rest.list_checkpoints(a.model_id).result().checkpoints
        assert [(cp.checkpoint_id, cp.tinker_path) for cp in listed] == [
            ("weights/end", end),
            ("weights/mid", path),
        ]
        assert listed[1].user_metadata == {"note": "two steps"}
        assert all(cp.checkpoint_type == "training" and cp.size_bytes for cp in listed)
        newest = rest.list_user_checkpoints(limit=1).result()
        assert newest.cursor is not None and newest.cursor.total_count == 3
        assert [cp.tinker_path for cp in newest.checkpoints] == [twice]
        mine = rest.list_user_checkpoints().result().checkpoints
        assert [cp.tinker_path for cp in mine] == [twice, end, path]
        info = rest.get_weights_info_by_tinker_path(path).result()
        assert (info.base_model, info.lora_rank, info.is_lora) == (BASE, 4, True)
        run = rest.get_training_run_by_tinker_path(path).result()
        assert run.training_run_id == a.model_id and run.last_checkpoint is not None
        assert run.last_checkpoint.tinker_path == end
        used = artifact_bytes(api.url, key_a)
        assert used == sum(cp.size_bytes or 0 for cp in mine) > 0
        assert artifact_bytes(api.url, key_b) == 0
        rest.delete_checkpoint_from_tinker_path(end).result()
        assert artifact_bytes(api.url, key_a) == used - (listed[0].size_bytes or 0)
        assert [
            cp.tinker_path for cp in rest.list_checkpoints(a.model_id).result().checkpoints
        ] == [path]
        with pytest.raises(tinker.NotFoundError):
            service.create_training_client_from_state(end).result()
