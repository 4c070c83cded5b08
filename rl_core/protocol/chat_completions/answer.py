"""The answer to a chat-completions request: ``chat.completion`` in OpenAI's schema.

Serialised as OpenAI sends it: ``content`` is null (not left out) when the answer is
tool calls only, ``logprobs`` is null unless asked for, and ``tool_calls`` is left
out when there are none. A tool call's ``arguments`` is the text the model sampled
(`rl_core.sessions.reply`).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer


class SparseModel(BaseModel):
    """Serialises without its None fields, but those in ``_keep_null`` (OpenAI sends null)."""

    _keep_null: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None or k in self._keep_null}


class FunctionCallOut(BaseModel):
    name: str
    arguments: str  # exactly the text the model sampled (see `rl_core.sessions.reply`)


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class ReplyMessage(SparseModel):
    _keep_null: ClassVar[frozenset[str]] = frozenset({"content"})

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None

    def echo(self) -> dict[str, Any]:
        """The message as a client sends it back in the next request's ``messages``."""
        return self.model_dump(mode="json")


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None
    # With ``top_logprobs: k``: the k most likely tokens of the distribution this token
    # was drawn from (the run's or the client's sampler, under the grammar's mask).
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None
    refusal: None = None


FinishReason = Literal["stop", "length", "tool_calls"]


class Choice(BaseModel):
    index: int = 0
    message: ReplyMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    """``chat.completion``: the answer to a request without ``stream``."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), ensure_ascii=False)


__all__ = [
    "ChatCompletion",
    "Choice",
    "ChoiceLogprobs",
    "FinishReason",
    "FunctionCallOut",
    "ReplyMessage",
    "SparseModel",
    "TokenLogprob",
    "ToolCallOut",
    "TopLogprob",
    "Usage",
]
