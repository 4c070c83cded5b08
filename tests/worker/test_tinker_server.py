"""worker.tinker_server applies a model's training calls in seq_id order, whatever order
they arrive in, and its sampler snapshots do not move with training."""

from __future__ import annotations

import asyncio
from typing import Any

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
