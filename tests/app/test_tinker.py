"""The official ``tinker`` SDK (0.38), unchanged, against rlaas on loopback.

A real control plane (uvicorn, Postgres migrated by Alembic) and a real model worker
(worker.tinker_server's aiohttp app, in a thread of this process, holding ``builtin:tiny``,
registered with the API through /internal/tinker/workers).
Tenant A's ``ServiceClient``: a LoRA model, sampler weights saved and sampled, training
with ``importance_sampling`` on its own samples (the trainer's logprobs of the sampled
tokens equal the sampler's, so the ratio starts at 1) until the loss falls, a
``cross_entropy`` pass, trained weights sampled while the first snapshot still answers as
before. Meanwhile tenant B trains a model of its own on the same base (``cross_entropy``,
from another thread); each tenant's losses step by step equal those of the same calls
on a model trained alone (1e-4), and neither tenant reaches the other's model (404), nor
B A's weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tinker
from tinker import types

from rl_core.store import ArtifactStore
from tests.web.live import WORKER_TOKEN, live_api, migrated_database
from worker.tinker_server import Registration, TinkerWorker, serve

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(1)]

BASE = "builtin:tiny"
PROMPT = [1, 5, 6, 7]
ADVANTAGES = [1.0, -1.0, 1.0, -1.0]  # the task: prefer samples 0 and 2 to 1 and 3


@contextlib.contextmanager
def tinker_worker(api_url: str, store: ArtifactStore | None = None) -> Iterator[str]:
    """worker.tinker_server on a free loopback port, in a thread, registered with the API
    as ``python -m worker.tinker_server`` registers (its own secret, the worker credential).
    ``store``: where saved state goes (the API's own; None: save_state is refused)."""
    registration = Registration(api_url, WORKER_TOKEN)
    token = secrets.token_urlsafe(16)
    ids: list[str] = []
    loop = asyncio.new_event_loop()
    task: list[asyncio.Task[None]] = []

    def bound(url: str) -> None:
        ids.append(registration.register(url, token, (BASE,)))

    def run() -> None:
        asyncio.set_event_loop(loop)
        worker = TinkerWorker((BASE,), store)
        server = serve(worker, token=token, host="127.0.0.1", port=0, bound=bound)
        task.append(loop.create_task(server))
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task[0])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not ids:
        assert thread.is_alive() and time.monotonic() < deadline, "the tinker worker did not start"
        time.sleep(0.02)
    try:
        yield ids[0]
    finally:
        loop.call_soon_threadsafe(task[0].cancel)
        thread.join(10)
        registration.deregister()


def alone_losses(steps: int, data: list[types.Datum], loss_fn: str, *, rank: int) -> list[float]:
    """The losses of ``steps`` rounds of forward_backward + optim_step (learning rate 0.05)
    on ``data``, for a model trained alone in this process (rl_core's `LoraModel`, the
    worker's base and LoRA settings, seed 0): the reference for a model the worker batched."""
    from rl_core.pretrained.sources import load_model
    from rl_core.spec import ModelSpec
    from rl_core.training.lora import LoraConfig
    from rl_core.training.primitives import AdamParams, Datum, LoraModel

    model, _ = load_model(ModelSpec(source=BASE), seed=0)
    lora = LoraConfig(rank=rank, alpha=float(rank), targets=("q", "k", "v", "o"))
    alone = LoraModel(model, rank=rank, seed=0, lora=lora)
    plain = [
        Datum(
            tokens=d.model_input.to_ints(),
            inputs={k: v.to_numpy().tolist() for k, v in d.loss_fn_inputs.items()},
        )
        for d in data
    ]
    out = []
    for _ in range(steps):
        out.append(alone.forward_backward(plain, loss_fn)[1])
        alone.optim_step(AdamParams(learning_rate=0.05))
    return out


def datum(completion: list[int], logprobs: list[float], advantage: float) -> types.Datum:
    """Prompt + completion; only the completion's tokens carry the loss (advantage 0 before)."""
    tokens = PROMPT + completion
    head = len(PROMPT) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.array(tokens[1:], dtype=np.int64)),
            "logprobs": types.TensorData.from_numpy(np.array([0.0] * head + logprobs, np.float32)),
            "advantages": types.TensorData.from_numpy(
                np.array([0.0] * head + [advantage] * len(completion), np.float32)
            ),
        },
    )


def test_the_official_client_trains_and_samples_a_lora_model(postgres_url: str) -> None:
    # Polls answer try_again after 0.3 s: the client's re-polling is exercised.
    with (
        live_api(migrated_database(postgres_url), tinker_long_poll_s=0.3) as api,
        tinker_worker(api.url),
        contextlib.ExitStack() as clients,
    ):
        key_a, key_b = api.tenant(), api.tenant()
        service = clients.enter_context(
            tinker.ServiceClient(base_url=api.url, api_key=f"tml-{key_a}")
        )
        rest = tinker.RestClient(base_url=api.url, api_key=f"tml-{key_a}")
        served = rest.get_server_capabilities().result().supported_models
        assert BASE in [m.model_name for m in served]
        training = service.create_lora_training_client(base_model=BASE, rank=4, seed=0).result()
        model_id = training.model_id
        info = training.get_info()
        assert (info.model_id, info.lora_rank) == (model_id, 4)

        # Sample the untrained adapter from saved sampler weights.
        first = training.save_weights_for_sampler(name="init").result().path
        assert first == f"tinker://{model_id}/sampler_weights/init"
        sampler = service.create_sampling_client(model_path=first).result()
        params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3)
        prompt = types.ModelInput.from_ints(PROMPT)
        sampled = sampler.sample(prompt, num_samples=4, sampling_params=params).result()
        seqs = [(list(s.tokens), list(s.logprobs or [])) for s in sampled.sequences]
        assert len(seqs) == 4 and all(len(t) == len(lp) > 0 for t, lp in seqs)

        # The untrained adapter is the identity (its B is 0): the base samples the same.
        base = service.create_sampling_client(base_model=BASE).result()
        from_base = base.sample(prompt, num_samples=4, sampling_params=params).result()
        assert [list(s.tokens) for s in from_base.sequences] == [t for t, _ in seqs]

        # A cross_entropy datum: weights pick the tokens that count.
        ce = types.Datum(
            model_input=types.ModelInput.from_ints(PROMPT[:-1]),
            loss_fn_inputs={
                "target_tokens": types.TensorData.from_numpy(np.array(PROMPT[1:], np.int64)),
                "weights": types.TensorData.from_numpy(np.array([1.0, 0.5, 1.0], np.float32)),
            },
        )

        # Meanwhile tenant B trains a model of its own on the same base, with its own client.
        service_b = clients.enter_context(
            tinker.ServiceClient(base_url=api.url, api_key=f"tml-{key_b}")
        )

        def train_b() -> tuple[str, list[float]]:
            b = service_b.create_lora_training_client(base_model=BASE, rank=2).result()
            b_losses = []
            for _ in range(3):
                b_losses.append(
                    b.forward_backward([ce], "cross_entropy").result().metrics["loss:sum"]
                )
                b.optim_step(types.AdamParams(learning_rate=0.05)).result()
            return b.model_id, b_losses

        pool = ThreadPoolExecutor(1)
        b_training = pool.submit(train_b)

        # Train on those samples with the importance-sampling loss.
        data = [datum(t, lp, a) for (t, lp), a in zip(seqs, ADVANTAGES, strict=True)]
        losses = []
        for step in range(4):
            out = training.forward_backward(data, "importance_sampling").result()
            losses.append(out.metrics["loss:sum"])
            if step == 0:  # the trainer scores the sampled tokens as the sampler did
                for (_, lp), row in zip(seqs, out.loss_fn_outputs, strict=True):
                    got = row["logprobs"].to_numpy()[len(PROMPT) - 1 :]
                    np.testing.assert_allclose(got, lp, atol=2e-3)
            training.optim_step(types.AdamParams(learning_rate=0.05)).result()
        assert losses[-1] < losses[0] - 0.1, losses
        b_model, b_losses = b_training.result(timeout=120)
        pool.shutdown()
        assert b_losses[-1] < b_losses[0], b_losses
        # Trained at once on one base (their calls batched in the worker's shared trainer),
        # each tenant's model moved exactly as the same calls move a model trained alone:
        # every step's loss is that of the weights the earlier steps left.
        alone_a = alone_losses(4, data, "importance_sampling", rank=4)
        alone_b = alone_losses(3, [ce], "cross_entropy", rank=2)
        np.testing.assert_allclose(losses, alone_a, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(b_losses, alone_b, rtol=1e-4, atol=1e-5)

        # cross_entropy: the loss is minus the weighted sum of the logprobs it answers.
        ce_only = training.forward([ce], "cross_entropy").result()  # no gradient
        ce_out = training.forward_backward([ce], "cross_entropy").result()
        assert ce_only.metrics["loss:sum"] == pytest.approx(ce_out.metrics["loss:sum"], rel=1e-5)
        lp = ce_out.loss_fn_outputs[0]["logprobs"].to_numpy()
        assert ce_out.metrics["loss:sum"] == pytest.approx(-(lp * [1.0, 0.5, 1.0]).sum(), rel=1e-4)

        # The trained weights sample; the first snapshot answers as before training.
        trained = training.save_weights_and_get_sampling_client().result()
        again = trained.sample(prompt, num_samples=4, sampling_params=params).result()
        assert len(again.sequences) == 4
        same = sampler.sample(prompt, num_samples=4, sampling_params=params).result()
        assert [list(s.tokens) for s in same.sequences] == [t for t, _ in seqs]
        np.testing.assert_allclose(
            [x for s in same.sequences for x in s.logprobs or []],
            [x for _, lp in seqs for x in lp],
            atol=1e-5,
        )

        # Neither tenant reaches the other's model; B does not reach A's sampler weights.
        for key, other_model in ((key_b, model_id), (key_a, b_model)):
            other = httpx.post(
                f"{api.url}/api/v1/get_info",
                json={"model_id": other_model},
                headers={"X-API-Key": f"tml-{key}"},
            )
            assert other.status_code == 404, other.text
        with pytest.raises(tinker.NotFoundError):
            service_b.create_sampling_client(model_path=first).result().sample(
                prompt, num_samples=1, sampling_params=params
            ).result()


def test_over_tokens_per_minute_the_client_waits_and_then_succeeds(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A 429 on tokens per minute slows the official client's loop rather than failing it:
    the client sleeps Retry-After and sends the call again (docs/tinker.md, limits)."""
    # 10 tokens a second, 600 at once; two forward_backwards of 315 tokens sent back to
    # back: the second is 30 tokens (3 s) short.
    with (
        live_api(migrated_database(postgres_url), tinker_tokens_per_minute=600) as api,
        tinker_worker(api.url),
        contextlib.ExitStack() as clients,
    ):
        service = clients.enter_context(
            tinker.ServiceClient(base_url=api.url, api_key=f"tml-{api.tenant()}")
        )
        training = service.create_lora_training_client(base_model=BASE, rank=2).result()
        tokens = [1 + i % 60 for i in range(64)]
        ce = types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={
                "target_tokens": types.TensorData.from_numpy(np.array(tokens[1:], np.int64)),
                "weights": types.TensorData.from_numpy(np.ones(63, np.float32)),
            },
        )
        with caplog.at_level(logging.INFO, logger="rlaas.access"):
            start = time.monotonic()
            first = training.forward_backward([ce] * 5, "cross_entropy")
            second = training.forward_backward([ce] * 5, "cross_entropy")
            losses = [first.result().metrics["loss:sum"], second.result().metrics["loss:sum"]]
            waited = time.monotonic() - start
        refused = [r for r in caplog.records if "/api/v1/forward_backward 429" in r.getMessage()]
        assert refused, "the second call was not refused: the limit was not reached"
        assert waited >= 2.0, waited  # it waited for the tokens, as Retry-After said
        assert losses[0] == pytest.approx(losses[1], rel=1e-4)  # no optim_step between
