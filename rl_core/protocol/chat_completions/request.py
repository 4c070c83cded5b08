"""The chat-completions request, and OpenAI's error body for what is not served.

What is supported, and what is refused. A field this server does not honour is
never ignored: the request fails with OpenAI's error body naming it
(`ChatCompletionError`, ``{"error": {"message", "type": "invalid_request_error",
"param", "code"}}``), ``code`` saying which kind:

- ``unsupported_parameter``: a field this server does not take at all
  (``frequency_penalty``, ``presence_penalty``, ``logit_bias``, ``response_format``,
  ``user``, ``metadata``, ``name`` on a message, ...);
- ``unsupported_value``: a field it takes, with a value it cannot honour: ``n``
  other than 1 (a session is one trajectory), ``top_logprobs`` above 0 (the
  engine returns the sampled token's logprob only), ``tool_choice`` ``"required"``
  or a named function and a tool's ``strict: true`` (both need constrained
  decoding), ``parallel_tool_calls: false``, ``stream_options`` without
  ``stream``, a content part that is not text;
- ``missing_required_parameter`` and ``invalid_value`` for the rest.

Taken as OpenAI documents them: ``model`` (echoed back), ``messages`` (``system``
and ``developer`` (rendered as system), ``user``, ``assistant`` with ``content``
and/or ``tool_calls``, ``tool`` with ``tool_call_id``; content as a string or a
list of text parts, joined with newlines), ``tools`` (functions), ``tool_choice``
``"auto"`` / ``"none"``, ``temperature`` and ``top_p`` (they must equal the run's
sampler: checked by the session, which knows the run), ``max_tokens`` /
``max_completion_tokens`` (an upper bound; the run's own limits may end a turn
sooner, with ``finish_reason: "length"``), ``stop`` (a string or a list of up to 4
non-empty strings: the answer ends before the first one its text reaches, with
``finish_reason: "stop"``; the engine samples as always, and the session keeps the
sampled tokens up to the one that completes the string, `rl_core.sessions.stop`),
``n: 1``, ``logprobs`` (the sampled tokens' logprobs under the run's sampler, after
temperature and top-p: what the trainer uses), ``top_logprobs: 0``, ``stream`` with
``stream_options.include_usage``, ``seed``. Types are strict (``"0.7"`` is not a
number, ``1`` is not a boolean).

An assistant message the official client echoes back may carry ``refusal``,
``function_call``, ``audio`` and ``annotations``; they are accepted when empty
(null, or ``[]`` for annotations), since this server never sets them.
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
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

# --- errors -----------------------------------------------------------------------------


class ChatCompletionError(Exception):
    """A request this server refuses, as OpenAI's error body; ``status`` is the HTTP status."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code
        self.status, self.type = status, type

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


# Why some well-known OpenAI fields are refused, so the message says what to change.
_REFUSED_FIELDS = {
    "frequency_penalty": "it changes the sampling distribution, which must be the run's sampler",
    "presence_penalty": "it changes the sampling distribution, which must be the run's sampler",
    "logit_bias": "it changes the sampling distribution, which must be the run's sampler",
    "response_format": "structured output needs constrained decoding, which this server lacks",
    "functions": "the deprecated functions API is not served; use tools",
    "function_call": "the deprecated functions API is not served; use tool_choice",
}


def request_error(exc: ValidationError) -> ChatCompletionError:
    """The first problem of ``exc`` as OpenAI's error, naming its field by JSON path."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    param = _param(first["loc"])
    more = f" ({len(errors) - 1} more problem{'s' if len(errors) > 2 else ''} after this one)"
    more = more if len(errors) > 1 else ""
    kind, msg = first["type"], str(first["msg"])
    if kind == "extra_forbidden":
        why = _REFUSED_FIELDS.get(param or "", "this server does not take it")
        message = f"Unsupported parameter: '{param}': {why}; remove it.{more}"
        return ChatCompletionError(message, param=param, code="unsupported_parameter")
    if kind == "missing":
        message = f"Missing required parameter: '{param}'.{more}"
        return ChatCompletionError(message, param=param, code="missing_required_parameter")
    if kind == "json_invalid":
        return ChatCompletionError(f"The body is not valid JSON: {msg}.", code="invalid_json")
    if kind == "invalid_role":
        param = f"{param}.role"
        message = f"Invalid value for '{param}': {msg}.{more}"
        return ChatCompletionError(message, param=param, code="invalid_value")
    if kind == "unsupported_value":
        message = f"Unsupported value for '{param}': {msg}.{more}"
        return ChatCompletionError(message, param=param, code="unsupported_value")
    where = f"'{param}'" if param else "the body"
    message = f"Invalid value for {where}: {msg[:1].lower() + msg[1:]}.{more}"
    return ChatCompletionError(message, param=param, code="invalid_value")


_ROLE_TAGS = frozenset({"system", "user", "assistant", "tool"})


def _param(loc: tuple[int | str, ...]) -> str | None:
    """``('messages', 2, 'tool', 'tool_call_id')`` -> ``messages[2].tool_call_id``."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i >= 2 and loc[i - 2] == "messages" and isinstance(loc[i - 1], int):
            if part in _ROLE_TAGS:
                continue  # the discriminated union's branch, not a field
            out += f".{part}"
        else:
            out += f".{part}" if out else part
    return out or None


def _unsupported(message: str, **context: Any) -> PydanticCustomError:
    return PydanticCustomError("unsupported_value", message, context)


MAX_STOP = 4  # OpenAI's limit on stop sequences


def _stop_sequences(value: Any) -> Any:
    """OpenAI's ``stop``, a string or a list of strings, as a tuple (None for none)."""
    if value is None:
        return None
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
        raise PydanticCustomError("invalid_value", "expected a string or a list of strings", {})
    if len(strings) > MAX_STOP:
        raise PydanticCustomError(
            "invalid_value",
            "at most {most} stop sequences are taken, not {count}",
            {"most": MAX_STOP, "count": len(strings)},
        )
    if not all(strings):
        raise PydanticCustomError("invalid_value", "a stop sequence cannot be empty", {})
    return tuple(strings) or None


# Shared with the legacy completions request (`rl_core.protocol.completions`).
Stop = Annotated[tuple[StrictStr, ...] | None, BeforeValidator(_stop_sequences)]


# --- the request ------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _text_content(value: Any) -> Any:
    """A string, or OpenAI's list of content parts of which only text ones are served."""
    if not isinstance(value, list):
        return value
    texts = []
    for index, part in enumerate(value):
        if not isinstance(part, Mapping):
            raise PydanticCustomError(
                "invalid_value", "content part {index} must be an object", {"index": index}
            )
        kind = part.get("type")
        if kind != "text":
            raise _unsupported(
                "content part {index} is of type '{kind}'; only text parts are served",
                index=index,
                kind=kind,
            )
        if set(part) != {"type", "text"} or not isinstance(part["text"], str):
            raise PydanticCustomError(
                "invalid_value",
                "content part {index} must be exactly {'type': 'text', 'text': <string>}",
                {"index": index},
            )
        texts.append(part["text"])
    return "\n".join(texts)


Content = Annotated[StrictStr, BeforeValidator(_text_content)]


class SystemMessage(_Strict):
    role: Literal["system", "developer"]
    content: Content


class UserMessage(_Strict):
    role: Literal["user"]
    content: Content


class FunctionCall(_Strict):
    name: StrictStr
    arguments: StrictStr  # JSON text, as the model wrote it


class ToolCall(_Strict):
    id: StrictStr
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(_Strict):
    role: Literal["assistant"]
    tool_calls: list[ToolCall] | None = None
    content: Content | None = Field(default=None, validate_default=True)
    # Set by OpenAI's own replies, never by this server's: accepted only empty.
    refusal: None = None
    function_call: None = None
    audio: None = None
    annotations: Annotated[list[None], Field(max_length=0)] | None = None

    @field_validator("content")
    @classmethod
    def _says_something(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and not info.data.get("tool_calls"):
            raise PydanticCustomError(
                "invalid_value", "an assistant message needs content or tool_calls", {}
            )
        return value


class ToolMessage(_Strict):
    role: Literal["tool"]
    content: Content
    tool_call_id: StrictStr


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


class FunctionDefinition(_Strict):
    name: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema, shown to the model as written
    strict: StrictBool | None = None

    @field_validator("strict")
    @classmethod
    def _not_strict(cls, value: bool | None) -> bool | None:
        if value:
            raise _unsupported("strict function calling needs constrained decoding")
        return value


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class StreamOptions(_Strict):
    include_usage: StrictBool | None = None


class ChatCompletionRequest(_Strict):
    """``POST /chat/completions``: see the module docstring for what is served."""

    model: StrictStr
    messages: Annotated[list[Message], Field(min_length=1)]
    tools: list[Tool] | None = None
    tool_choice: Any = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    stop: Stop = None
    n: StrictInt | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    seed: StrictInt | None = None
    parallel_tool_calls: StrictBool | None = None

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: Any) -> Any:
        if value is None or value in ("auto", "none"):
            return value
        if value == "required" or isinstance(value, Mapping):
            raise _unsupported(
                "only 'auto' and 'none' are served; forcing a tool call needs constrained decoding"
            )
        raise PydanticCustomError(
            "invalid_value", "expected 'none', 'auto', 'required' or a function", {}
        )

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise _unsupported("a session is one trajectory: n must be 1")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise _unsupported("the engine returns only the sampled token's logprob; use 0")
        return value

    @field_validator("parallel_tool_calls")
    @classmethod
    def _parallel(cls, value: bool | None) -> bool | None:
        if value is False:
            raise _unsupported("limiting the model to one tool call needs constrained decoding")
        return value

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_limit(cls, value: int | None, info: ValidationInfo) -> int | None:
        other = info.data.get("max_tokens")
        if value is not None and other is not None and value != other:
            raise PydanticCustomError(
                "invalid_value",
                "max_tokens ({other}) and max_completion_tokens ({value}) disagree; send one",
                {"other": other, "value": value},
            )
        return value

    @field_validator("stream_options")
    @classmethod
    def _streaming(cls, value: StreamOptions | None, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("stream"):
            raise _unsupported("stream_options needs stream: true")
        return value

    @property
    def token_limit(self) -> int | None:
        """The most completion tokens the client accepts (None: the server's limit)."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def calls_tools(self) -> bool:
        """Whether the reply is read for tool calls: tools given and ``tool_choice`` not none."""
        return bool(self.tools) and self.tool_choice != "none"


def parse_request(body: bytes | str | Mapping[str, Any]) -> ChatCompletionRequest:
    """The request, or `ChatCompletionError` naming the first field that is wrong."""
    try:
        if isinstance(body, bytes | str):
            return ChatCompletionRequest.model_validate_json(body)
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise request_error(exc) from None


__all__ = [
    "MAX_STOP",
    "AssistantMessage",
    "ChatCompletionError",
    "ChatCompletionRequest",
    "FunctionCall",
    "FunctionDefinition",
    "Message",
    "Stop",
    "StreamOptions",
    "SystemMessage",
    "Tool",
    "ToolCall",
    "ToolMessage",
    "UserMessage",
    "parse_request",
    "request_error",
]
