"""The webhook models: strict on known fields, tolerant of unknown ones, errors that name fields."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from rl_core.protocol.webhook import (
    ErrorAnswer,
    ResetAnswer,
    ResetRequest,
    StepAnswer,
    StepRequest,
    parse_callback,
    problems,
)


def error_of(model: Any, body: Any) -> str:
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    return problems(info.value)


def test_unknown_fields_are_ignored_but_a_messages_own_extras_are_kept() -> None:
    answer = StepAnswer.model_validate(
        {
            "reward": 1,
            "done": True,
            "trace_id": "abc",  # another server's extra: ignored
            "messages": [{"role": "tool", "content": "4", "tool_call_id": "t1", "name": "calc"}],
        }
    )
    assert answer.reward == 1.0 and answer.info == {} and not hasattr(answer, "trace_id")
    assert answer.messages[0].model_dump(exclude_unset=True) == {
        "role": "tool",
        "content": "4",
        "tool_call_id": "t1",
        "name": "calc",
    }
    request = StepRequest.model_validate(
        {"episode_id": "e", "step": 1, "action": {"content": "x", "tool_calls": None}, "v2": 1}
    )
    assert request.action.tool_calls == []


def test_null_means_absent_for_optional_objects_and_lists() -> None:
    reset = ResetAnswer.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": None, "info": None}
    )
    assert (reset.tools, reset.info) == ([], {})
    assert ResetRequest.model_validate({"episode_id": "e", "seed": 0, "config": None}).config == {}


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"reward": "1", "done": True}, "'reward': input should be a valid number"),
        ({"reward": True, "done": True}, "'reward': input should be a valid number"),
        ({"reward": math.nan, "done": True}, "'reward': input should be a finite number"),
        ({"reward": 0.0, "done": 1}, "'done': input should be a valid boolean"),
        ({"done": False}, "'reward': field required"),
        (
            {"reward": 0.0, "done": False, "messages": [{"role": "system", "content": "x"}]},
            "'messages.0.role': input should be 'tool' or 'user'",
        ),
        (
            {"reward": 0.0, "done": False, "messages": [{"role": "user", "content": None}]},
            "'messages.0.content': input should be a valid string",
        ),
    ],
)
def test_a_wrong_step_answer_names_the_field(body: dict[str, Any], words: str) -> None:
    assert words in error_of(StepAnswer, body)


def test_a_missing_request_field_says_its_type() -> None:
    assert error_of(ResetRequest, {"episode_id": "e"}) == "'seed' must be a int: field required"
    assert "'seed': input should be a valid integer" in error_of(
        ResetRequest, {"episode_id": "e", "seed": "1"}
    )
    assert error_of(StepRequest, {"episode_id": "e", "step": 1}) == "'action': field required"


def test_a_callback_body_is_a_step_answer_or_an_error() -> None:
    assert isinstance(parse_callback({"reward": 1.0, "done": True}), StepAnswer)
    failure = parse_callback({"error": {"code": "boom", "message": "it broke"}})
    assert isinstance(failure, ErrorAnswer) and failure.error.message == "it broke"
    with pytest.raises(ValidationError):
        parse_callback({"error": "it broke"})  # an error must be {code?, message}
