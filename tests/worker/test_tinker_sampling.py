"""The Tinker worker samples sampler snapshots as adapters in engine slots: a snapshot is the
model's adapter frozen at the save (a few KB here, not a copy of the base), training after
the save never changes what it samples, samples of several models run in one engine batch
and answer as each sampled alone, and more snapshots than slots take turns in them."""

from __future__ import annotations

import asyncio
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

from tests.rl_core.rollout.test_adapter_slots import hold_device_thread
from worker.tinker_sampling import SAMPLER_SLOTS, sampler_slots
from worker.tinker_server import TinkerWorker

BASE = "builtin:tiny"
PROMPT = [1, 5, 6, 7]
TOKENS = [1, 5, 6, 7, 8, 9]


async def _trained(worker: TinkerWorker, model_id: str, seed: int, steps: int = 3) -> None:
    """``steps`` of cross_entropy with a large learning rate: the adapter moves off the
    identity (a fresh adapter samples as the base and would prove nothing)."""
    if model_id not in worker.models:
        body = {"model_id": model_id, "base_model": BASE, "rank": 4, "seed": seed}
        await worker.create(body)
    target = [10 + 7 * seed + j for j in range(5)]  # each model its own task
    datum = {"tokens": TOKENS[:-1], "inputs": {"target_tokens": target, "weights": [1.0] * 5}}
    for _ in range(steps):
        await worker.forward_backward(model_id, {"loss_fn": "cross_entropy", "data": [datum]})
        await worker.optim_step(model_id, {"adam": {"learning_rate": 0.05}})


async def _sample(worker: TinkerWorker, path: str, seed: int = 3) -> list[dict[str, Any]]:
    body = {"model_path": path, "prompt": PROMPT, "num_samples": 3, "max_tokens": 6}
    answer = await worker.sample({**body, "temperature": 1.0, "seed": seed})
    sequences: list[dict[str, Any]] = answer["sequences"]
    return sequences


def _assert_same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert [s["tokens"] for s in got] == [s["tokens"] for s in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g["logprobs"], w["logprobs"], atol=1e-5)


def test_a_snapshot_is_the_adapter_and_training_after_the_save_does_not_change_it() -> None:
    async def scenario() -> tuple[Any, ...]:
        worker = TinkerWorker((BASE,))
        try:
            await _trained(worker, "m", seed=1)
            await worker.save_for_sampler("m", {"path": "tinker://m/sampler_weights/a"})
            before = await _sample(worker, "tinker://m/sampler_weights/a")
            await _trained(worker, "m", seed=1)  # training goes on after the save
            after = await _sample(worker, "tinker://m/sampler_weights/a")
            await worker.save_for_sampler("m", {"path": "tinker://m/sampler_weights/b"})
            newer = await _sample(worker, "tinker://m/sampler_weights/b")
            snapshot = worker.samplers["tinker://m/sampler_weights/a"]
            base_bytes = sum(
                int(x.nbytes) for x in jax.tree.leaves(nnx.state(worker.bases[BASE].model))
            )
            return before, after, newer, snapshot.nbytes, base_bytes
        finally:
            await worker.close()

    before, after, newer, snapshot_bytes, base_bytes = asyncio.run(scenario())
    _assert_same(after, before)
    assert [s["tokens"] for s in newer] != [s["tokens"] for s in before]  # training moved it
    # The snapshot holds the adapter (rank 4 on q k v o: 14 KB), not the base (~0.4 MB).
    assert snapshot_bytes < base_bytes / 10, (snapshot_bytes, base_bytes)


def test_samples_of_several_models_share_one_engine_batch_and_answer_as_alone() -> None:
    paths = [f"tinker://m{i}/sampler_weights/s" for i in range(3)]

    async def setup(worker: TinkerWorker) -> None:
        for i in range(3):
            await _trained(worker, f"m{i}", seed=i + 1)
            await worker.save_for_sampler(f"m{i}", {"path": paths[i]})

    async def together() -> tuple[list[Any], list[Any], int]:
        worker = TinkerWorker((BASE,))
        try:
            await setup(worker)
            await _sample(worker, paths[0])  # the engine's first call: its programs compile
            engine = worker.bases[BASE].sampling[worker.samplers[paths[0]].lora].engine
            before = engine.batches_run
            # The device thread waits while the three calls reach the engine: on a loaded
            # machine they may otherwise take longer than its 2 ms gathering window.
            gate = await hold_device_thread(engine)
            calls = asyncio.gather(*(_sample(worker, p) for p in paths))
            await asyncio.sleep(0.5)
            gate.set()
            answers = await calls
            base = await worker.sample({"base_model": BASE, "prompt": PROMPT, "seed": 3})
            return list(answers), base["sequences"], engine.batches_run - before
        finally:
            await worker.close()

    async def alone() -> list[Any]:
        worker = TinkerWorker((BASE,))
        try:
            await setup(worker)
            return [await _sample(worker, p) for p in paths]
        finally:
            await worker.close()

    answers, base, prefills = asyncio.run(together())
    assert prefills == 1  # three models' calls, one packed prefill: one batch
    expected = asyncio.run(alone())
    for got, want in zip(answers, expected, strict=True):
        _assert_same(got, want)
    tokens = [tuple(tuple(s["tokens"]) for s in a) for a in answers]
    assert len(set(tokens)) == 3  # three adapters, three different answers
    assert len(base) == 1 and base[0]["tokens"]


def test_more_snapshots_than_slots_take_turns_and_answer_the_same() -> None:
    """One slot for three snapshots sampled at once: each waits for the slot, is loaded
    into it, and answers as with a slot of its own."""
    paths = [f"tinker://m{i}/sampler_weights/s" for i in range(3)]

    async def run(slots: int) -> tuple[list[Any], int]:
        worker = TinkerWorker((BASE,), sampler_slots=slots)
        try:
            for i in range(3):
                await _trained(worker, f"m{i}", seed=i + 1)
                await worker.save_for_sampler(f"m{i}", {"path": paths[i]})
            answers = await asyncio.gather(*(_sample(worker, p) for p in paths))
            again = await _sample(worker, paths[0])  # evicted since: loaded again
            cache = worker.bases[BASE].sampling[worker.samplers[paths[0]].lora]
            return [*answers, again], cache.loads
        finally:
            await worker.close()

    shared, loads = asyncio.run(run(slots=1))
    own, own_loads = asyncio.run(run(slots=4))
    assert (loads, own_loads) == (4, 3)
    for got, want in zip(shared, own, strict=True):
        _assert_same(got, want)


def test_the_slots_setting_is_read_and_a_bad_one_named() -> None:
    assert sampler_slots({}) == SAMPLER_SLOTS
    assert sampler_slots({"RLAAS_TINKER_SAMPLER_SLOTS": " 32 "}) == 32
    for bad in ("0", "-2", "2.5", "lots", "99999"):
        with pytest.raises(ValueError, match="RLAAS_TINKER_SAMPLER_SLOTS must be"):
            sampler_slots({"RLAAS_TINKER_SAMPLER_SLOTS": bad})
