"""worker.tinker_server applies a model's training calls in seq_id order, whatever order
they arrive in, and its sampler snapshots do not move with training; models on one base
are slots of one trainer, their concurrent calls batched, each trained as it would alone."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from worker.tinker_server import Refused, TinkerWorker

TOKENS = [1, 5, 6, 7, 8]
DATUM = {"tokens": TOKENS[:-1], "inputs": {"target_tokens": TOKENS[1:], "weights": [1.0] * 4}}


def test_training_calls_apply_in_seq_id_order() -> None:
    async def scenario() -> tuple[list[Any], Any]:
        worker = TinkerWorker(("builtin:tiny",))
        await worker.create({"model_id": "m", "base_model": "builtin:tiny", "rank": 4})
        fb = {"loss_fn": "cross_entropy", "data": [DATUM]}
        # Sent 3, 2, 1: applied forward_backward (1), optim_step (2), forward_backward (3).
        third = asyncio.create_task(worker.forward_backward("m", {**fb, "seq_id": 3}))
        second = asyncio.create_task(
            worker.optim_step("m", {"seq_id": 2, "adam": {"learning_rate": 0.05}})
        )
        first = asyncio.create_task(worker.forward_backward("m", {**fb, "seq_id": 1}))
        answers = await asyncio.gather(first, second, third)
        try:
            await worker.optim_step("m", {"seq_id": 2, "adam": {}})
        except Refused as exc:
            return answers, exc
        return answers, None

    (first, second, third), refused = asyncio.run(scenario())
    assert second["metrics"]["step"] == 1.0 and second["metrics"]["grad_norm"] > 0
    assert third["loss"] < first["loss"]  # the step came between them
    assert refused is not None and refused.status == 409 and "already applied" in str(refused)


def _train(worker: TinkerWorker, model_id: str, advantages: list[float]) -> Any:
    """Three steps of importance sampling on fixed data; seq_ids 1..6."""

    async def steps() -> None:
        data = {
            "tokens": TOKENS[:-1],
            "inputs": {
                "target_tokens": TOKENS[1:],
                "logprobs": [-3.0] * 4,
                "advantages": advantages,
            },
        }
        for i in range(3):
            body = {"loss_fn": "importance_sampling", "data": [data], "seq_id": 2 * i + 1}
            await worker.forward_backward(model_id, body)
            await worker.optim_step(
                model_id, {"seq_id": 2 * i + 2, "adam": {"learning_rate": 0.02}}
            )

    return steps()


def test_two_models_on_one_base_train_as_each_would_alone() -> None:
    a_adv, b_adv = [1.0, 0.5, 0.0, 1.0], [-1.0, 0.0, 2.0, 1.0]

    async def together() -> tuple[Any, Any]:
        worker = TinkerWorker(("builtin:tiny",))
        for model_id, seed in (("a", 1), ("b", 2)):
            await worker.create(
                {"model_id": model_id, "base_model": "builtin:tiny", "rank": 4, "seed": seed}
            )
        await asyncio.gather(_train(worker, "a", a_adv), _train(worker, "b", b_adv))
        assert len(worker.bases) == 1  # one base loaded for both
        a, b = worker.models["a"], worker.models["b"]
        assert a.pool is b.pool and a.slot != b.slot  # one trainer, two slots
        # Six forward_backward calls in fewer programs: at least the first step's two
        # (made ready in one turn of the loop) ran as one batch.
        assert a.pool.batches < 6
        return a.pool.trainer.adapter(a.slot), b.pool.trainer.adapter(b.slot)

    async def alone() -> Any:
        worker = TinkerWorker(("builtin:tiny",))
        await worker.create({"model_id": "a", "base_model": "builtin:tiny", "rank": 4, "seed": 1})
        await _train(worker, "a", a_adv)
        a = worker.models["a"]
        return a.pool.trainer.adapter(a.slot)

    a, b = asyncio.run(together())
    a_alone = asyncio.run(alone())
    for name, ad in a_alone.items():
        np.testing.assert_allclose(np.asarray(a[name]["b"]), np.asarray(ad["b"]), atol=1e-6)
        assert not np.allclose(np.asarray(a[name]["b"]), np.asarray(b[name]["b"]))
    assert any(np.abs(np.asarray(ad["b"])).max() > 0 for ad in a_alone.values())  # it trained


def test_a_bad_call_batched_with_a_good_one_fails_alone() -> None:
    async def scenario() -> tuple[Any, Any, int]:
        worker = TinkerWorker(("builtin:tiny",))
        for model_id in ("good", "bad"):
            await worker.create({"model_id": model_id, "base_model": "builtin:tiny", "rank": 4})
        bad = {"tokens": TOKENS[:-1], "inputs": {"target_tokens": TOKENS[1:]}}  # no weights
        good, refused = await asyncio.gather(
            worker.forward_backward("good", {"loss_fn": "cross_entropy", "data": [DATUM]}),
            worker.forward_backward("bad", {"loss_fn": "cross_entropy", "data": [bad]}),
            return_exceptions=True,
        )
        return good, refused, worker.models["good"].pool.batches

    good, refused, batches = asyncio.run(scenario())
    assert good["loss"] > 0 and len(good["logprobs"][0]) == 4
    assert "data[0].loss_fn_inputs.weights" in str(refused)
    assert batches == 3  # tried together, then each alone


def test_a_datum_longer_than_the_base_context_is_refused_by_name() -> None:
    async def scenario() -> str:
        worker = TinkerWorker(("builtin:tiny",))
        await worker.create({"model_id": "m", "base_model": "builtin:tiny", "rank": 2})
        too_long = worker.models["m"].pool.trainer.max_len + 1
        datum = {"tokens": [1] * too_long, "inputs": {"target_tokens": [1] * too_long}}
        body = {"loss_fn": "cross_entropy", "data": [datum], "seq_id": 1}
        try:
            await worker.forward_backward("m", body)
        except Exception as exc:
            return str(exc)
        return "accepted"

    message = asyncio.run(scenario())
    assert "data[0].model_input" in message and "context" in message


def test_unload_drops_the_model_and_its_snapshots_only() -> None:
    """The control plane's unload_model: the model's memory is given back (its adapter and
    its sampler snapshots); another model on the base is untouched; a second unload is no
    error (the caller wants it gone)."""

    async def scenario() -> TinkerWorker:
        worker = TinkerWorker(("builtin:tiny",))
        for model_id in ("a", "b"):
            await worker.create({"model_id": model_id, "base_model": "builtin:tiny", "rank": 2})
            path = f"tinker://{model_id}/sampler_weights/s"
            await worker.save_for_sampler(model_id, {"path": path, "seq_id": 1})
        assert await worker.unload("a", {}) == {"model_id": "a"}
        assert await worker.unload("a", {}) == {"model_id": "a"}
        return worker

    worker = asyncio.run(scenario())
    assert list(worker.models) == ["b"] and list(worker.samplers) == [
        "tinker://b/sampler_weights/s"
    ]
    with pytest.raises(Refused) as refused:
        worker.model("a")
    assert refused.value.status == 404
