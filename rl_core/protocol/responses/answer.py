"""The ``response`` object of OpenAI's Responses API, as this server fills it.

Its output is a ``message`` item (one ``output_text`` part) when the answer has text,
then one ``function_call`` item per tool call, in the order the model wrote them
(the chat answer's content and tool calls, `rl_core.protocol.responses.translate`).
A call's ``call_id`` is the chat answer's tool call id and its ``arguments`` the text
the model sampled, so an echoed item renders the model's own tokens. A turn cut at
the token limit is ``status: "incomplete"`` with ``incomplete_details.reason:
"max_output_tokens"``, as OpenAI reports it.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from rl_core.protocol.chat_completions import ChatCompletionError
from rl_core.protocol.chat_completions.answer import SparseModel


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class OutputLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class OutputText(SparseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[OutputLogprob] | None = None


class OutputMessageItem(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[OutputText]


class FunctionCallOutput(BaseModel):
    """A ``function_call`` output item (named so beside the input item of that type)."""

    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


OutputItem = OutputMessageItem | FunctionCallOutput


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(cls, input_tokens: int, output_tokens: int) -> ResponseUsage:
        return cls(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            total_tokens=input_tokens + output_tokens,
        )


class ResponseError(BaseModel):
    code: str
    message: str


class Response(SparseModel):
    """``response``: what ``POST /responses`` answers (and its stream's last event holds)."""

    # OpenAI sends these null rather than leaving them out.
    _keep_null: ClassVar[frozenset[str]] = frozenset(
        {
            "error",
            "incomplete_details",
            "instructions",
            "max_output_tokens",
            "previous_response_id",
            "temperature",
            "top_p",
            "user",
            "completed_at",
            "top_logprobs",
        }
    )

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    model: str
    output: list[OutputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool = True
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    tool_choice: Any = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    truncation: Literal["disabled"] = "disabled"
    user: str | None = None
    usage: ResponseUsage | None = None

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), ensure_ascii=False)

    def as_started(self) -> Response:
        """This response as the stream announces it first: in progress, no output yet."""
        return self.model_copy(
            update={
                "status": "in_progress",
                "output": [],
                "usage": None,
                "completed_at": None,
                "incomplete_details": None,
            }
        )


def not_found(response_id: str) -> ChatCompletionError:
    return ChatCompletionError(
        f"Previous response with id '{response_id}' not found in this session: a response "
        "is kept by the session that answered it, until that session ends",
        param="previous_response_id",
        code="previous_response_not_found",
    )


__all__ = [
    "FunctionCallOutput",
    "IncompleteDetails",
    "OutputItem",
    "OutputLogprob",
    "OutputMessageItem",
    "OutputText",
    "Response",
    "ResponseUsage",
    "TopLogprob",
    "not_found",
]
