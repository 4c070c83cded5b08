"""The legacy completions request and answer: what is served, refused, and how it streams."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rl_core.protocol.chat_completions import ChatCompletionError, Usage
from rl_core.protocol.chat_completions.stream import DONE
from rl_core.protocol.completions import (
    CompletionChoice,
    CompletionLogprobs,
    TextCompletion,
    parse_completion_request,
    stream_text_completion,
)


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "policy", "prompt": "Once upon a time", **fields}


def refusal(request: Any) -> dict[str, Any]:
    with pytest.raises(ChatCompletionError) as caught:
        parse_completion_request(request)
    assert caught.value.status == 400
    error: dict[str, Any] = caught.value.body()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_everything_served_parses() -> None:
    request = parse_completion_request(
        json.dumps(
            body(
                prompt=["Once upon a time"],
                max_tokens=32,
                temperature=1.0,
                top_p=1.0,
                stop=["\n\n", "The end"],
                n=1,
                best_of=1,
                logprobs=0,
                echo=False,
                suffix=None,
                stream=True,
                stream_options={"include_usage": True},
                seed=3,
                frequency_penalty=0.5,
                presence_penalty=-0.5,
                top_k=-1,
                user="someone",
                logit_bias={},
            )
        )
    )
    assert request.prompt == "Once upon a time" and request.stop == ("\n\n", "The end")
    assert request.token_limit == 32 and request.logprobs == 0
    assert (request.frequency_penalty, request.presence_penalty) == (0.5, -0.5)
    assert parse_completion_request(body(logprobs=5)).logprobs == 5
    assert parse_completion_request(body()).token_limit == 16  # OpenAI's default


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"prompt": [1, 2, 3]}, "prompt", "unsupported_value"),
        ({"prompt": [[1, 2]]}, "prompt", "unsupported_value"),
        ({"prompt": ["a", "b"]}, "prompt", "unsupported_value"),
        ({"prompt": ""}, "prompt", "invalid_value"),
        ({"prompt": []}, "prompt", "invalid_value"),
        ({"logprobs": 6}, "logprobs", "invalid_value"),
        ({"echo": True}, "echo", "unsupported_value"),
        ({"suffix": "and they lived"}, "suffix", "unsupported_value"),
        ({"n": 2}, "n", "unsupported_value"),
        ({"best_of": 3}, "best_of", "unsupported_value"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "unsupported_value"),
        ({"frequency_penalty": 2.5}, "frequency_penalty", "invalid_value"),
        ({"logit_bias": {"1": 2}}, "logit_bias", "unsupported_value"),
        ({"guided_json": {}}, "guided_json", "unsupported_parameter"),
        ({"max_tokens": "8"}, "max_tokens", "invalid_value"),
    ],
)
def test_what_is_not_served_is_refused_by_name(
    fields: dict[str, Any], param: str, code: str
) -> None:
    error = refusal(body(**fields))
    assert (error["param"], error["code"]) == (param, code)
    assert f"'{param}'" in error["message"]


def test_every_problem_is_named_in_the_one_error() -> None:
    error = refusal(body(n=2, echo=True, guided_json={}))
    assert error["param"] == "n" and error["code"] == "unsupported_value"
    assert error["message"].startswith("This request has 3 problems: (1) ")
    for field in ("'n'", "'echo'", "'guided_json'"):
        assert field in error["message"]
    assert "more problem" not in error["message"]


def test_the_answer_has_openais_shape_and_streams_back_to_it() -> None:
    logprobs = CompletionLogprobs(
        tokens=[" there", " was"],
        token_logprobs=[-0.5, -0.25],
        top_logprobs=[{" there": -0.5}, {" was": -0.25}],
        text_offset=[16, 22],
    )
    answer = TextCompletion(
        id="cmpl-s-0",
        created=1,
        model="policy",
        choices=[CompletionChoice(text=" there was", logprobs=logprobs, finish_reason="stop")],
        usage=Usage(prompt_tokens=4, completion_tokens=2, total_tokens=6),
    )
    data = json.loads(answer.to_json())
    assert data["object"] == "text_completion"
    assert data["choices"][0] == {
        "text": " there was",
        "index": 0,
        "logprobs": logprobs.model_dump(),
        "finish_reason": "stop",
    }

    events = stream_text_completion(answer, include_usage=True, piece_chars=3)
    assert events[-1] == DONE
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert all(c["object"] == "text_completion" and c["id"] == "cmpl-s-0" for c in chunks)
    texts = [c["choices"][0] for c in chunks if c["choices"]]
    assert "".join(t["text"] for t in texts) == " there was"
    assert [t["finish_reason"] for t in texts] == [None] * (len(texts) - 1) + ["stop"]
    assert texts[-1]["logprobs"] == logprobs.model_dump()
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == data["usage"]
    assert "usage" not in chunks[0]
