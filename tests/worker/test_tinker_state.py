"""worker.tinker_server's saved state: a model saved to the artifact store by one worker is
created, or loaded into a model, by another worker (another `TinkerWorker`, the same store)
and trains on as the saving model does; the save is taken in turn with the model's calls;
a state of another rank is refused naming both; a worker without a store says so."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from rl_core.store import open_store
from worker.tinker_server import Refused, TinkerWorker

BASE = "builtin:tiny"
TOKENS = [1, 5, 6, 7, 8]
DATA = {
    "loss_fn": "importance_sampling",
    "data": [
        {
            "tokens": TOKENS[:-1],
            "inputs": {
                "target_tokens": TOKENS[1:],
                "logprobs": [-3.0] * 4,
                "advantages": [1.0, 0.5, 0.0, 1.0],
            },
        }
    ],
}


async def _steps(worker: TinkerWorker, model_id: str, first_seq: int, n: int) -> list[float]:
    losses = []
    for i in range(n):
        seq = first_seq + 2 * i
        losses.append((await worker.forward_backward(model_id, {**DATA, "seq_id": seq}))["loss"])
        await worker.optim_step(model_id, {"seq_id": seq + 1, "adam": {"learning_rate": 0.05}})
    return losses


def test_a_state_saved_by_one_worker_trains_on_in_another() -> None:
    store = open_store("memory://")

    async def scenario() -> dict[str, Any]:
        first = TinkerWorker((BASE,), store=store)
        await first.create({"model_id": "a", "base_model": BASE, "rank": 4, "seed": 1})
        await _steps(first, "a", 1, 2)
        # Sent before the step it must not see: applied in seq_id order all the same.
        later = asyncio.create_task(_steps(first, "a", 6, 2))
        saved = await first.save_state("a", {"seq_id": 5, "key": "tinker/t/ck"})
        continued = await later

        second = TinkerWorker((BASE,), store=store)  # fresh: no base loaded, no model
        state = {"key": "tinker/t/ck", "optimizer": True}
        await second.create({"model_id": "b", "base_model": BASE, "rank": 4, "state": state})
        resumed = await _steps(second, "b", 1, 2)
        # Weights only into a model that exists: Adam starts again, so the second step differs.
        await second.create({"model_id": "c", "base_model": BASE, "rank": 4, "seed": 7})
        await second.load_state("c", {"seq_id": 1, "key": "tinker/t/ck", "optimizer": False})
        weights_only = await _steps(second, "c", 2, 2)
        # Another rank: refused, naming what the state was saved from.
        await second.create({"model_id": "r2", "base_model": BASE, "rank": 2})
        try:
            await second.load_state("r2", {"seq_id": 1, "key": "tinker/t/ck", "optimizer": True})
            refused = None
        except Refused as exc:
            refused = exc
        c = second.models["c"]
        return {
            "saved": saved,
            "continued": continued,
            "resumed": resumed,
            "weights_only": weights_only,
            "refused": refused,
            "c_step": c.pool.trainer.steps[c.slot],
        }

    out = asyncio.run(scenario())
    assert out["saved"]["size_bytes"] == sum(o.size for o in store.list("tinker/t/ck"))
    assert out["resumed"] == pytest.approx(out["continued"], rel=1e-6)
    assert out["weights_only"][0] == pytest.approx(out["continued"][0], rel=1e-6)
    assert out["weights_only"][1] != pytest.approx(out["continued"][1], rel=1e-4)
    assert out["c_step"] == 2  # counted from the load, not from the saved model's 2
    refused = out["refused"]
    assert refused is not None and refused.status == 400
    assert "rank-4" in str(refused) and "rank 2" in str(refused)


def test_a_worker_without_a_store_refuses_to_save_saying_so() -> None:
    async def scenario() -> Refused:
        worker = TinkerWorker((BASE,))
        await worker.create({"model_id": "a", "base_model": BASE, "rank": 2})
        with pytest.raises(Refused) as refused:
            await worker.save_state("a", {"seq_id": 1, "key": "k"})
        return refused.value

    refused = asyncio.run(scenario())
    assert refused.status == 503 and "RLAAS_ARTIFACT_STORE" in str(refused)


def test_without_a_store_the_api_and_a_worker_on_one_data_folder_use_the_same_one(
    tmp_path: Path,
) -> None:
    """The embedded default: no RLAAS_ARTIFACT_STORE, one data folder; the worker writes
    saved state where the API deletes and counts it (the API refuses a save written
    anywhere else: `check_same_store`)."""
    from app.services.tinker_state import state_store
    from app.settings import Settings
    from worker.settings import WorkerSettings

    api = state_store(Settings(data_dir=tmp_path, artifact_store=None))
    worker = WorkerSettings(data_dir=tmp_path, artifact_store=None).state_store()
    assert api.url == worker.url == f"file://{tmp_path / 'artifacts'}"


def test_a_save_in_another_store_is_refused_without_naming_either(tmp_path: Path) -> None:
    """The stores' addresses are the deployment's: the tenant reads what is wrong, not where."""
    from app.services.tinker import WorkerRefusal
    from app.services.tinker_state import check_same_store
    from rl_core.store import open_store

    api = open_store(f"file://{tmp_path / 'api'}")
    elsewhere = open_store(f"file://{tmp_path / 'worker'}")
    check_same_store({"store": api.url}, api)  # the same store: recorded
    with pytest.raises(WorkerRefusal) as refused:
        check_same_store({"store": elsewhere.url}, api)
    assert "RLAAS_ARTIFACT_STORE" in str(refused.value)
    assert str(tmp_path) not in str(refused.value)
