"""The messages of a chat-completions request, as clients and frameworks send them.

Rendered (`rl_core.sessions.render`): each message's role and text content, an
assistant message's tool calls, a tool message's ``tool_call_id``. ``developer`` is
rendered as ``system``. Content is a string or a list of text parts (joined with
newlines); any other part (an image, audio, a file) is refused.

**Accepted and not rendered**, because frameworks echo them back and none of them is
text this model sampled (this server's answers never set them):

- on an assistant message: ``reasoning_content``, ``reasoning`` and
  ``reasoning_details`` (verifiers, openai-agents and LangChain echo a provider's
  reasoning there; this server's answer holds all the model's text in ``content``),
  ``refusal``, ``annotations``, ``audio``, ``function_call: null``, ``name``, and a
  tool call's ``index`` (what a client that accumulated a stream keeps);
- ``name`` on any message (OpenAI's participant name: not part of a chat template).

A non-null ``function_call`` (the deprecated functions API) is refused: its call would
be lost, leaving the model's own turn out of its context.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictInt,
    StrictStr,
    Tag,
    ValidationInfo,
    field_validator,
)

from rl_core.protocol.chat_completions.errors import invalid, unsupported


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _text_content(value: Any) -> Any:
    """A string, or OpenAI's list of content parts of which only text ones are served."""
    if not isinstance(value, list):
        return value
    texts = []
    for index, part in enumerate(value):
        if not isinstance(part, Mapping):
            raise invalid("content part {index} must be an object", index=index)
        kind = part.get("type")
        if kind != "text":
            raise unsupported(
                "content part {index} is of type '{kind}'; only text parts are served",
                index=index,
                kind=kind,
            )
        if set(part) != {"type", "text"} or not isinstance(part["text"], str):
            raise invalid(
                "content part {index} must be exactly {'type': 'text', 'text': <string>}",
                index=index,
            )
        texts.append(part["text"])
    return "\n".join(texts)


Content = Annotated[StrictStr, BeforeValidator(_text_content)]
Name = StrictStr | None  # OpenAI's participant name: accepted, not rendered


class SystemMessage(Strict):
    role: Literal["system", "developer"]
    content: Content
    name: Name = None


class UserMessage(Strict):
    role: Literal["user"]
    content: Content
    name: Name = None


class FunctionCall(Strict):
    name: StrictStr
    arguments: StrictStr  # JSON text, as the model wrote it


class ToolCall(Strict):
    id: StrictStr
    type: Literal["function"]
    function: FunctionCall
    index: StrictInt | None = None  # kept by clients that accumulated a stream; not rendered


class AssistantMessage(Strict):
    role: Literal["assistant"]
    tool_calls: list[ToolCall] | None = None
    content: Content | None = Field(default=None, validate_default=True)
    name: Name = None
    # Echoed by frameworks, never text this model sampled here: accepted, not rendered.
    refusal: StrictStr | None = None
    reasoning_content: StrictStr | None = None
    reasoning: Any = None
    reasoning_details: Any = None
    annotations: list[Any] | None = None
    audio: Any = None
    function_call: Any = None

    @field_validator("content")
    @classmethod
    def _says_something(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and not info.data.get("tool_calls"):
            raise invalid("an assistant message needs content or tool_calls")
        return value

    @field_validator("function_call")
    @classmethod
    def _no_function_call(cls, value: Any) -> Any:
        if value is not None:
            raise unsupported(
                "the deprecated functions API is not served: send the call as tool_calls"
            )
        return value


class ToolMessage(Strict):
    role: Literal["tool"]
    content: Content
    tool_call_id: StrictStr
    name: Name = None


def _role(value: Any) -> str | None:
    role = value.get("role") if isinstance(value, Mapping) else getattr(value, "role", None)
    return "system" if role == "developer" else role


Message = Annotated[
    Annotated[SystemMessage, Tag("system")]
    | Annotated[UserMessage, Tag("user")]
    | Annotated[AssistantMessage, Tag("assistant")]
    | Annotated[ToolMessage, Tag("tool")],
    Discriminator(
        _role,
        custom_error_type="invalid_role",
        custom_error_message="role must be system, developer, user, assistant or tool",
    ),
]


__all__ = [
    "AssistantMessage",
    "Content",
    "FunctionCall",
    "Message",
    "Strict",
    "SystemMessage",
    "ToolCall",
    "ToolMessage",
    "UserMessage",
]
