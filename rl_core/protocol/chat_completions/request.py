"""The chat-completions request: what is served, accepted or refused, as OpenAI's error body.

Every problem of a refused request is named in the one error (`errors.refusal`),
each by its JSON path, ``code`` the first's kind:

- ``unsupported_parameter``: a field this server does not take (``prediction``,
  ``audio``, ``web_search_options``, the deprecated ``functions``, any field it does
  not know: unknown fields are refused, not ignored, because an ignored sampling or
  format option would quietly change the answer);
- ``unsupported_value``: a field it takes with a value it cannot honour: ``n`` other
  than 1 (a session is one member of its group: open ``n`` sessions with one group
  name), ``logit_bias`` with entries, ``min_p`` other than 0, ``repetition_penalty``
  other than 1, ``modalities`` other than text, ``stream_options`` without ``stream``,
  a content part that is not text, a ``custom`` tool;
- ``missing_required_parameter`` and ``invalid_value`` for the rest.

**Served** as OpenAI documents them: ``model`` (echoed back), ``messages``
(`messages`), ``tools`` (functions, ``strict`` included), ``tool_choice`` (``auto``,
``none``, ``required`` or a named function), ``parallel_tool_calls``,
``response_format`` (``text``, ``json_object``, ``json_schema``), the sampling fields
``temperature``, ``top_p``, ``frequency_penalty``, ``presence_penalty`` and vLLM's
``top_k`` (within the run's bounds, checked by the session, which knows the run),
``max_tokens`` / ``max_completion_tokens``, ``stop`` (up to 4 strings), ``n: 1``,
``logprobs`` with ``top_logprobs`` 0 to 20, ``stream`` with ``stream_options``,
``seed``. Forcing choices and strict schemas are served by constrained decoding
(`rl_core.sessions.grammar`).

**Accepted and ignored**, with the meaning they have here: ``store``, ``metadata``,
``user``, ``safety_identifier``, ``service_tier``, ``prompt_cache_key``,
``prompt_cache_retention``, ``prompt_cache_options`` (nothing is stored, billed or
cached by key), ``reasoning_effort`` and ``verbosity`` (the run's policy decides how
it writes), ``modalities: ["text"]``, ``stream_options.include_obfuscation``,
``logit_bias: {}``, ``min_p: 0``, ``repetition_penalty: 1``.

Types are strict (``"0.7"`` is not a number, ``1`` is not a boolean).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from rl_core.protocol.chat_completions.errors import (
    ChatCompletionError,
    Problem,
    invalid,
    refusal,
    request_error,
    unsupported,
)
from rl_core.protocol.chat_completions.messages import (
    AssistantMessage,
    FunctionCall,
    Message,
    Strict,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)

MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_TOP_LOGPROBS = 20  # OpenAI's, for chat


def _stop_sequences(value: Any) -> Any:
    """OpenAI's ``stop``, a string or a list of strings, as a tuple (None for none)."""
    if value is None:
        return None
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
        raise invalid("expected a string or a list of strings")
    if len(strings) > MAX_STOP:
        raise invalid(
            "at most {most} stop sequences are taken, not {count}",
            most=MAX_STOP,
            count=len(strings),
        )
    if not all(strings):
        raise invalid("a stop sequence cannot be empty")
    return tuple(strings) or None


# Shared with the legacy completions request (`rl_core.protocol.completions`).
Stop = Annotated[tuple[StrictStr, ...] | None, BeforeValidator(_stop_sequences)]
Penalty = Annotated[float, Field(ge=-2, le=2)] | None


class FunctionDefinition(Strict):
    name: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema, shown to the model as written
    # True: the arguments are sampled under the schema (constrained decoding).
    strict: StrictBool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDefinition

    @field_validator("type", mode="before")
    @classmethod
    def _function_only(cls, value: Any) -> Any:
        if value == "custom":
            raise unsupported("custom (free-form) tools are not served; use a function tool")
        return value


class NamedFunction(Strict):
    name: StrictStr


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("auto", "none", "required"):
        return value
    if isinstance(value, Mapping):
        if value.get("type") == "function":
            return NamedToolChoice.model_validate(value)
        raise unsupported(
            "tool_choice of type '{kind}' is not served; send 'auto', 'none', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
            kind=value.get("type"),
        )
    raise invalid("expected 'none', 'auto', 'required' or a named function")


ToolChoice = Annotated[
    Literal["auto", "none", "required"] | NamedToolChoice | None, BeforeValidator(_tool_choice)
]


class TextFormat(Strict):
    type: Literal["text"]


class JsonObjectFormat(Strict):
    type: Literal["json_object"]


class JsonSchema(Strict):
    name: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: StrictStr | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    # Strict or not, the answer is sampled under the schema: that is what a client wants.
    strict: StrictBool | None = None


class JsonSchemaFormat(Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchema


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


class StreamOptions(Strict):
    include_usage: StrictBool | None = None
    include_obfuscation: StrictBool | None = None  # accepted: nothing here is obfuscated


class ChatCompletionRequest(Strict):
    """``POST /chat/completions``: see the module docstring for what is served."""

    model: StrictStr
    messages: Annotated[list[Message], Field(min_length=1)]
    tools: list[Tool] | None = None
    tool_choice: ToolChoice = None
    parallel_tool_calls: StrictBool | None = None
    response_format: ResponseFormat | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = None  # vLLM's; -1 and 0 are off
    frequency_penalty: Penalty = None
    presence_penalty: Penalty = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    stop: Stop = None
    n: StrictInt | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    seed: StrictInt | None = None
    # Accepted, with no effect here (the module docstring says why).
    store: StrictBool | None = None
    metadata: dict[str, Any] | None = None
    user: StrictStr | None = None
    safety_identifier: StrictStr | None = None
    service_tier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    prompt_cache_retention: StrictStr | None = None
    prompt_cache_options: Any = None
    reasoning_effort: StrictStr | None = None
    verbosity: StrictStr | None = None
    modalities: list[StrictStr] | None = None
    logit_bias: dict[str, Any] | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise unsupported(
                "a session is one member of its GRPO group, so it answers one choice; for "
                "{n} samples of one prompt open {n} sessions with the same group name "
                "(POST /v1/sessions with {'group': ...}) and make the call in each",
                n=value,
            )
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value:
            raise unsupported(
                "it changes the sampling distribution, which the engines do not serve; send "
                "an empty object or leave it out"
            )
        return value

    @field_validator("min_p")
    @classmethod
    def _no_min_p(cls, value: float | None) -> float | None:
        if value:
            raise unsupported("the engines do not serve a min-p filter; send 0 or leave it out")
        return value

    @field_validator("repetition_penalty")
    @classmethod
    def _no_repetition_penalty(cls, value: float | None) -> float | None:
        if value is not None and value != 1:
            raise unsupported(
                "the engines do not serve vLLM's repetition_penalty; use frequency_penalty "
                "or presence_penalty, or send 1"
            )
        return value

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(m != "text" for m in value):
            raise unsupported("only text is served: send ['text'] or leave it out")
        return value

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_limit(cls, value: int | None, info: ValidationInfo) -> int | None:
        other = info.data.get("max_tokens")
        if value is not None and other is not None and value != other:
            raise invalid(
                "max_tokens ({other}) and max_completion_tokens ({value}) disagree; send one",
                other=other,
                value=value,
            )
        return value

    @field_validator("stream_options")
    @classmethod
    def _streaming(cls, value: StreamOptions | None, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("stream"):
            raise unsupported("stream_options needs stream: true")
        return value

    def problems(self) -> list[Problem]:
        """What is wrong across fields (each field alone being valid)."""
        choice, names = self.tool_choice, [t.function.name for t in self.tools or ()]
        forced = choice == "required" or isinstance(choice, NamedToolChoice)
        if forced and not names:
            return [
                Problem(
                    "tool_choice",
                    "Invalid value for 'tool_choice': it forces a tool call, but the request "
                    "has no tools.",
                    "invalid_value",
                )
            ]
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            return [
                Problem(
                    "tool_choice.function.name",
                    f"Invalid value for 'tool_choice.function.name': '{choice.function.name}' "
                    f"is not one of the tools ({', '.join(names)}).",
                    "invalid_value",
                )
            ]
        return []

    @property
    def token_limit(self) -> int | None:
        """The most completion tokens the client accepts (None: the server's limit)."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def calls_tools(self) -> bool:
        """Whether the reply is read for tool calls: tools given and ``tool_choice`` not none."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def top_logprobs_asked(self) -> int:
        """How many alternatives per token the answer lists (only with ``logprobs: true``)."""
        return (self.top_logprobs or 0) if self.logprobs else 0


def parse_request(body: bytes | str | Mapping[str, Any]) -> ChatCompletionRequest:
    """The request, or `ChatCompletionError` naming every field that is wrong."""
    try:
        if isinstance(body, bytes | str):
            request = ChatCompletionRequest.model_validate_json(body)
        else:
            request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise request_error(exc) from None
    if problems := request.problems():
        raise refusal(problems)
    return request


__all__ = [
    "MAX_STOP",
    "MAX_TOP_LOGPROBS",
    "AssistantMessage",
    "ChatCompletionError",
    "ChatCompletionRequest",
    "FunctionCall",
    "FunctionDefinition",
    "JsonObjectFormat",
    "JsonSchema",
    "JsonSchemaFormat",
    "Message",
    "NamedToolChoice",
    "Problem",
    "ResponseFormat",
    "Stop",
    "StreamOptions",
    "SystemMessage",
    "TextFormat",
    "Tool",
    "ToolCall",
    "ToolChoice",
    "ToolMessage",
    "UserMessage",
    "parse_request",
    "refusal",
    "request_error",
]
