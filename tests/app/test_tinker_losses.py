"""The official ``tinker`` client (0.38) with the losses beyond cross_entropy and
importance_sampling, ``loss_fn_config``, ``forward_backward_custom``, prompt logprobs and
top-k logprobs, against rlaas on loopback (the harness of tests/app/test_tinker.py: a
real control plane on Postgres and a real model worker holding ``builtin:tiny``).

Each loss trains (forward_backward, optim_step, forward_backward again) on completions
the model sampled itself, and every reported ``loss:sum`` equals the numpy reference of
the documented formula applied to the logprobs the same call answers
(tests/rl_core/training/tinker_reference.py). Prompt logprobs equal the trainer's
logprobs of the same tokens under the same weights (1e-5).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import tinker
import torch
from tinker import types

from tests.app.test_tinker import BASE, PROMPT, tinker_worker
from tests.rl_core.training.tinker_reference import reference
from tests.web.live import live_api, migrated_database

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(2)]

# What the client sends, and the config the trainer uses (the documented defaults filled in).
LOSSES: dict[str, tuple[dict[str, float] | None, dict[str, float]]] = {
    "ppo": (None, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    "cispo": (
        {"clip_high_threshold": 1.1},
        {"clip_low_threshold": 0.0, "clip_high_threshold": 1.1},
    ),
    "dro": ({"beta": 0.1}, {"beta": 0.1}),
    "gspo": (
        {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
        {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
    ),
}


@dataclass
class Served:
    service: tinker.ServiceClient


@pytest.fixture(scope="module")
def served(postgres_url: str) -> Iterator[Served]:
    with (
        live_api(migrated_database(postgres_url)) as api,
        tinker_worker(api.url),
        tinker.ServiceClient(base_url=api.url, api_key=f"tml-{api.tenant()}") as service,
    ):  # the client first out: its session finished, its heartbeat stopped
        yield Served(service)


def _rollouts(
    training: tinker.TrainingClient, n: int = 4
) -> list[tuple[list[int], list[float], float]]:
    """n completions of PROMPT from the model's current weights, and an advantage each."""
    sampler = training.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=5)
    got = sampler.sample(types.ModelInput.from_ints(PROMPT), n, params).result()
    advantages = [1.0, -1.0, 0.5, -0.5]
    return [
        (list(s.tokens), list(s.logprobs or []), a)
        for s, a in zip(got.sequences, advantages, strict=True)
    ]


def _datum(completion: list[int], logprobs: list[float], advantage: float) -> types.Datum:
    tokens = PROMPT + completion
    head = len(PROMPT) - 1
    inputs = {
        "target_tokens": np.array(tokens[1:], np.int64),
        "logprobs": np.array([0.0] * head + logprobs, np.float32),
        "advantages": np.array([0.0] * head + [advantage] * len(completion), np.float32),
        "sequence_ratio_mask": np.array([0.0] * head + [1.0] * len(completion), np.float32),
    }
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={k: types.TensorData.from_numpy(v) for k, v in inputs.items()},
    )


def _reference_loss(
    out: types.ForwardBackwardOutput, data: list[types.Datum], loss_fn: str, cfg: dict[str, float]
) -> float:
    total = 0.0
    for row, d in zip(out.loss_fn_outputs, data, strict=True):
        inputs = {k: v.to_numpy().tolist() for k, v in d.loss_fn_inputs.items()}
        total += reference(loss_fn, row["logprobs"].to_numpy(), inputs, cfg)[0]
    return total


@pytest.mark.parametrize("loss_fn", sorted(LOSSES))
def test_each_loss_trains_and_reports_the_documented_loss(served: Served, loss_fn: str) -> None:
    sent, used = LOSSES[loss_fn]
    training = served.service.create_lora_training_client(base_model=BASE, rank=4).result()
    data = [_datum(*r) for r in _rollouts(training)]
    losses = []
    for i in range(3):
        out = training.forward_backward(data, loss_fn, loss_fn_config=sent).result()
        assert len(out.loss_fn_outputs) == len(data)
        for row, d in zip(out.loss_fn_outputs, data, strict=True):
            assert row["logprobs"].to_numpy().shape == (d.model_input.length,)
        # The loss the server reports is the documented formula of the logprobs it answers.
        want = _reference_loss(out, data, loss_fn, used)
        assert out.metrics["loss:sum"] == pytest.approx(want, rel=1e-4, abs=1e-4)
        losses.append(out.metrics["loss:sum"])
        step = training.optim_step(types.AdamParams(learning_rate=0.05)).result()
        assert step.metrics is not None
        if i == 0:  # on the weights that sampled: nothing is clipped yet
            assert step.metrics["grad_norm"] > 0
    assert losses[0] != losses[-1]  # the steps moved the model


def test_refusals_name_the_loss_and_the_key(served: Served) -> None:
    training = served.service.create_lora_training_client(base_model=BASE, rank=2).result()
    data = [_datum([9, 10], [-1.0, -1.0], 1.0)]
    cases = [
        ("dro", None, "loss_fn_config.beta"),
        ("gspo", None, "loss_fn_config.clip_low_threshold"),
        ("ppo", {"beta": 0.1}, "loss_fn_config.beta"),
        ("stable_reinforce", None, "stable_reinforce"),
    ]
    for loss_fn, cfg, words in cases:
        with pytest.raises(tinker.BadRequestError, match=words):
            training.forward_backward(data, loss_fn, loss_fn_config=cfg).result()  # type: ignore[arg-type]


def test_forward_backward_custom_runs_the_client_side_loss(served: Served) -> None:
    training = served.service.create_lora_training_client(base_model=BASE, rank=2).result()
    data = [_datum([9, 10, 11], [-1.0] * 3, 1.0)]

    def squared(
        _: list[types.Datum], logprobs: list[torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        loss = sum((lp**2).sum() for lp in logprobs)
        return loss, {"squared": float(loss.detach())}  # type: ignore[union-attr]

    out = training.forward_backward_custom(data, squared).result()
    forward = training.forward(data, "importance_sampling").result()
    lp = forward.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert out.metrics["loss:sum"] == pytest.approx(float((lp**2).sum()), rel=1e-5)
    training.optim_step(types.AdamParams(learning_rate=0.05)).result()
    after = training.forward(data, "importance_sampling").result().loss_fn_outputs[0]["logprobs"]
    assert float((after.to_numpy() ** 2).sum()) < float((lp**2).sum())  # it descended


def test_prompt_logprobs_are_the_trainers_logprobs(served: Served) -> None:
    training = served.service.create_lora_training_client(base_model=BASE, rank=4).result()
    rollouts = _rollouts(training)
    data = [_datum(*r) for r in rollouts]
    training.forward_backward(data, "importance_sampling").result()
    training.optim_step(types.AdamParams(learning_rate=0.05)).result()  # off the base
    sampler = training.save_weights_and_get_sampling_client().result()
    sequence = PROMPT + rollouts[0][0]
    prompt = types.ModelInput.from_ints(sequence)

    scored = sampler.compute_logprobs(prompt).result()
    trained = training.forward([data[0]], "importance_sampling").result()
    want = trained.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert scored[0] is None and len(scored) == len(sequence)
    np.testing.assert_allclose(np.array(scored[1:], np.float32), want, rtol=0, atol=1e-5)

    last = sampler.compute_logprobs(prompt, prompt_logprobs_last_n=3).result()
    assert last[:-3] == [None] * (len(sequence) - 3)
    np.testing.assert_allclose(np.array(last[-3:], np.float32), want[-3:], rtol=0, atol=1e-5)

    # Top-k: the likeliest tokens at each position, and the sampled ones' own rows.
    k = 5
    answer = sampler.sample(
        prompt,
        num_samples=2,
        sampling_params=types.SamplingParams(max_tokens=4, seed=1),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=k,
        topk_sample_logprobs=3,
    ).result()
    assert answer.prompt_logprobs is not None and answer.topk_prompt_logprobs is not None
    np.testing.assert_allclose(np.array(answer.prompt_logprobs[1:], np.float32), want, atol=1e-5)
    assert answer.topk_prompt_logprobs[0] is None
    for i, row in enumerate(answer.topk_prompt_logprobs[1:], start=1):
        assert row is not None and len(row) == k
        values = [v for _, v in row]
        assert values == sorted(values, reverse=True)
        assert values[0] >= answer.prompt_logprobs[i] - 1e-6  # type: ignore[operator]
        for token, value in row:  # where the prompt's token is among them, the same number
            if token == sequence[i]:
                assert value == pytest.approx(answer.prompt_logprobs[i], abs=1e-5)
    for seq in answer.sequences:
        assert seq.topk_logprobs is not None and len(seq.topk_logprobs) == len(seq.tokens)
        for token, lp, row in zip(seq.tokens, seq.logprobs or [], seq.topk_logprobs, strict=True):
            assert row is not None and 1 <= len(row) <= 3
            for t, v in row:
                if t == token:
                    assert v == pytest.approx(lp, abs=1e-5)

    with pytest.raises(tinker.BadRequestError, match="target_prompt_logprobs"):
        ids = torch.full((len(sequence) - 1, 1), 3, dtype=torch.int64)
        sampler.sample(
            prompt,
            num_samples=1,
            sampling_params=types.SamplingParams(max_tokens=1),
            target_prompt_logprobs=types.TensorData.from_torch(ids),
        ).result()
