"""What the Tinker routes refuse of losses and of prompt scoring, before any work: a 400
naming the field and saying why (docs/tinker.md, Losses and Prompt logprobs).

Over ASGI with a worker URL that nothing listens on; forward_backward bodies are encoded
by the official SDK's own protobuf writer, as the client sends them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

from tests.app.conftest import Api, tml

pytestmark = pytest.mark.anyio


@pytest.fixture
def api(tinker_api: Api) -> Api:
    return tinker_api


def _body(loss_fn: str, config: dict[str, Any] | None) -> bytes:
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={
            "target_tokens": np.array([2, 3, 4], np.int64),
            "logprobs": np.zeros(3, np.float32),
            "advantages": np.ones(3, np.float32),
        },
    )
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=[datum],
            loss_fn=loss_fn,  # type: ignore[arg-type]
            loss_fn_config=config,
        ),
        model_id="tm_none",
        seq_id=1,
    )
    return forward_backward_request_to_proto(request).SerializeToString()


async def test_losses_and_configs_are_refused_naming_the_field(api: Api) -> None:
    headers = {**await tml(api), "Content-Type": "application/x-protobuf"}
    cases = [
        ("stable_reinforce", None, "loss_fn", "does not document"),
        ("custom", {"loss_id": "l1"}, "loss_fn", "forward_backward_custom"),
        ("grpo", None, "loss_fn", "not served"),
        ("dro", None, "loss_fn_config.beta", "no default"),
        ("gspo", {"clip_low_threshold": 0.9}, "loss_fn_config.clip_high_threshold", "no default"),
        ("ppo", {"clip_low_threshold": "tight"}, "loss_fn_config.clip_low_threshold", "number"),
        ("ppo", {"clip_low_threshold": 1.5}, "loss_fn_config.clip_low_threshold", "exceed"),
        ("cispo", {"beta": 0.1}, "loss_fn_config.beta", "does not read"),
        ("importance_sampling", {"beta": 0.1}, "loss_fn_config.beta", "no loss_fn_config"),
    ]
    for loss_fn, config, field, words in cases:
        r = await api.client.post(
            "/api/v1/forward_backward", content=_body(loss_fn, config), headers=headers
        )
        assert r.status_code == 400, (loss_fn, r.text)
        assert r.json()["error"]["field"] == field and words in r.json()["error"]["message"]
    # A served loss with its config passes these checks and meets the next one: no model.
    r = await api.client.post(
        "/api/v1/forward_backward", content=_body("dro", {"beta": 0.0}), headers=headers
    )
    assert r.status_code == 404 and r.json()["error"]["field"] == "model_id"


async def test_prompt_scoring_outside_what_is_served_is_refused(api: Api) -> None:
    auth = await tml(api)
    sample = {
        "base_model": "builtin:tiny",
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 5, 6, 7]}]},
        "sampling_params": {"max_tokens": 1},
        "num_samples": 1,
    }
    target = {"data": [3, 3, 3], "dtype": "int64", "shape": [3, 1]}
    cases = [
        ({"prompt_logprobs_last_n": 2}, "prompt_logprobs_last_n", "set prompt_logprobs"),
        ({"prompt_logprobs": True, "prompt_logprobs_last_n": 4}, "prompt_logprobs_last_n", "1 to"),
        ({"topk_prompt_logprobs": 65}, "topk_prompt_logprobs", "0 to 64"),
        ({"topk_sample_logprobs": 21}, "topk_sample_logprobs", "0 to 20"),
        ({"target_prompt_logprobs": target}, "target_prompt_logprobs", "not served"),
        ({"prompt_alt_tokens_k": 2}, "prompt_alt_tokens_k", "not served"),
        ({"prompt_logprobs": "yes"}, "prompt_logprobs", "true or false"),
    ]
    for extra, field, words in cases:
        r = await api.client.post("/api/v1/asample", json={**sample, **extra}, headers=auth)
        assert r.status_code == 400, (extra, r.text)
        assert r.json()["error"]["field"] == field and words in r.json()["error"]["message"]


async def test_closing_a_service_client_ends_its_session(api: Api) -> None:
    r = await api.client.post(
        "/api/v1/sessions/tss_1/finish",
        json={"reason": {"type": "success"}, "detail": None},
        headers=await tml(api),
    )
    assert r.status_code == 204
