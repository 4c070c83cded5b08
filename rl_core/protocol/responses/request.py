"""The Responses API request (``POST /responses``), and what of it is served.

Served as OpenAI documents it, by translation onto the chat core
(`rl_core.protocol.responses.translate`): ``model``, ``input`` (a string, or items:
messages of any role with text content, ``function_call`` and
``function_call_output`` items, and ``reasoning`` items, which are accepted and not
rendered: this policy writes none, so one echoed back is another model's), ``instructions``
(a system message before everything, not carried over by ``previous_response_id``),
function ``tools`` (Responses' flat shape, ``strict`` included), ``tool_choice``,
``parallel_tool_calls``, ``text.format`` (``text``, ``json_object``, ``json_schema``),
``max_output_tokens``, ``temperature``, ``top_p``, ``top_logprobs`` with ``include:
["message.output_text.logprobs"]``, ``previous_response_id`` (a response of the same
session), ``stream`` (``stream_options.include_obfuscation`` is accepted: nothing is
obfuscated).

Accepted, with no effect on the answer: ``store`` (the session keeps every response
until it ends, whatever ``store`` says: the session is the record), ``metadata``
(echoed back), ``user``, ``safety_identifier``, ``prompt_cache_key``,
``prompt_cache_retention``, ``service_tier``, ``reasoning`` (this policy has no
reasoning mode), ``truncation: "disabled"`` (the only behaviour), ``include:
["reasoning.encrypted_content"]`` (there is none to include).

Refused, naming the field and saying why (OpenAI's error body,
`rl_core.protocol.chat_completions.ChatCompletionError`): ``conversation``,
``prompt``, ``background``, ``max_tool_calls``, ``context_management``,
``truncation: "auto"``, ``text.verbosity``, tools other than functions, non-text
content, other item types, and any field not listed. What the chat core refuses
(its validation decides: strict tools and forcing choices need constrained decoding)
comes back named by the Responses field (``tools[0].strict``, ``text.format``).
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
    field_validator,
)
from pydantic_core import PydanticCustomError

from rl_core.protocol.chat_completions import ChatCompletionError

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# Include values that ask for nothing this server could add (no reasoning items).
_EMPTY_INCLUDES = frozenset({"reasoning.encrypted_content"})

# Why some documented fields are refused, so the message says what to change.
_REFUSED_FIELDS = {
    "conversation": "server-side conversations are not kept; chain calls with "
    "previous_response_id or send the whole input",
    "prompt": "stored prompt templates are not served; send instructions and input",
    "background": "background responses are not served; call without it",
    "max_tool_calls": "it limits built-in tools, which are not served",
    "context_management": "the context is never compacted; send what the model should see",
    "seed": "the Responses API has no seed; the session seeds each call itself",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _unsupported(message: str, **context: Any) -> PydanticCustomError:
    return PydanticCustomError("unsupported_value", message, context)


def _text_parts(allowed: frozenset[str]) -> Any:
    """Content as a string, or a list of text parts (of the ``allowed`` types) joined."""

    def check(value: Any) -> Any:
        if not isinstance(value, list):
            return value
        texts = []
        for index, part in enumerate(value):
            if not isinstance(part, Mapping):
                raise PydanticCustomError(
                    "invalid_value", "content part {index} must be an object", {"index": index}
                )
            kind = part.get("type")
            if kind not in allowed:
                raise _unsupported(
                    "content part {index} is of type '{kind}'; only text parts ({allowed}) "
                    "are served",
                    index=index,
                    kind=kind,
                    allowed=", ".join(sorted(allowed)),
                )
            # What OpenAI's own output parts carry besides the text: never set here.
            extra = set(part) - {"type", "text", "annotations", "logprobs"}
            if extra or not isinstance(part.get("text"), str):
                raise PydanticCustomError(
                    "invalid_value",
                    "content part {index} must be {{'type': '{kind}', 'text': <string>}}",
                    {"index": index, "kind": kind},
                )
            texts.append(part["text"])
        return "\n".join(texts)

    return BeforeValidator(check)


InputContent = Annotated[StrictStr, _text_parts(frozenset({"input_text"}))]
OutputContent = Annotated[StrictStr, _text_parts(frozenset({"output_text", "input_text"}))]


class InputMessage(_Strict):
    """A user, system or developer message (``EasyInputMessage`` or an input item)."""

    type: Literal["message"] | None = None
    role: Literal["user", "system", "developer"]
    content: InputContent
    id: StrictStr | None = None
    status: StrictStr | None = None


class OutputMessage(_Strict):
    """An assistant message: one this session answered, echoed back, or the client's."""

    type: Literal["message"] | None = None
    role: Literal["assistant"]
    content: OutputContent
    id: StrictStr | None = None
    status: StrictStr | None = None
    phase: StrictStr | None = None


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr  # JSON text, as the model wrote it
    id: StrictStr | None = None
    status: StrictStr | None = None
    namespace: StrictStr | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: StrictStr
    output: InputContent
    id: StrictStr | None = None
    status: StrictStr | None = None


class ReasoningItem(BaseModel):
    """Another model's reasoning, echoed back: accepted whatever it holds, never rendered."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: Literal["reasoning"]


_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


def _item_kind(value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return None
    kind = value.get("type", "message")
    if kind == "message":
        return "assistant" if value.get("role") == "assistant" else "message"
    return kind if kind in _ITEM_TYPES else None


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[OutputMessage, Tag("assistant")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(
        _item_kind,
        custom_error_type="unsupported_item",
        custom_error_message="served item types are message, function_call, "
        "function_call_output and reasoning",
    ),
]


class FunctionTool(_Strict):
    type: Literal["function"]
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


def _function_tool(value: Any) -> Any:
    if isinstance(value, Mapping) and value.get("type") != "function":
        raise _unsupported(
            "tools of type '{kind}' are not served; only function tools are",
            kind=value.get("type"),
        )
    return value


Tool = Annotated[FunctionTool, BeforeValidator(_function_tool)]


class NamedFunction(_Strict):
    type: Literal["function"]
    name: StrictStr


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("auto", "none", "required"):
        return value
    if isinstance(value, Mapping) and value.get("type") == "function":
        return value
    raise _unsupported(
        "only 'auto', 'none', 'required' and {{'type': 'function', 'name': ...}} are served"
    )


ToolChoice = Annotated[
    Literal["auto", "none", "required"] | NamedFunction | None, BeforeValidator(_tool_choice)
]


class TextFormatText(_Strict):
    type: Literal["text"]


class TextFormatJsonObject(_Strict):
    type: Literal["json_object"]


class TextFormatJsonSchema(_Strict):
    type: Literal["json_schema"]
    name: StrictStr
    schema_: dict[str, Any] = Field(alias="schema")
    description: StrictStr | None = None
    strict: StrictBool | None = None


TextFormat = Annotated[
    TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")
]


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: StrictStr | None = None

    @field_validator("verbosity")
    @classmethod
    def _no_verbosity(cls, value: str | None) -> str | None:
        if value is not None:
            raise _unsupported(
                "the answer's length is the model's own; bound it with max_output_tokens"
            )
        return value


class StreamOptions(_Strict):
    include_obfuscation: StrictBool | None = None  # accepted: nothing is obfuscated


def _as_items(value: Any) -> Any:
    """A string input is one user message."""
    return [{"role": "user", "content": value}] if isinstance(value, str) else value


class ResponsesRequest(_Strict):
    """``POST /responses``: see the module docstring for what is served."""

    model: StrictStr
    input: Annotated[list[InputItem], BeforeValidator(_as_items)]
    instructions: StrictStr | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice = None
    parallel_tool_calls: StrictBool | None = None
    text: TextConfig | None = None
    max_output_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    include: list[StrictStr] | None = None
    previous_response_id: StrictStr | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    # Accepted, with no effect on the answer (the module docstring says why).
    store: StrictBool | None = None
    metadata: dict[StrictStr, StrictStr] | None = None
    user: StrictStr | None = None
    safety_identifier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    prompt_cache_retention: StrictStr | None = None
    service_tier: StrictStr | None = None
    reasoning: dict[str, Any] | None = None
    truncation: Literal["disabled", "auto"] | None = None

    @field_validator("truncation")
    @classmethod
    def _no_truncation(cls, value: str | None) -> str | None:
        if value == "auto":
            raise _unsupported(
                "the context is never truncated here (a trajectory must hold what the model "
                "saw); send 'disabled' or leave it out"
            )
        return value

    @field_validator("include")
    @classmethod
    def _includes(cls, value: list[str] | None) -> list[str] | None:
        for index, name in enumerate(value or ()):
            if name != LOGPROBS_INCLUDE and name not in _EMPTY_INCLUDES:
                raise _unsupported(
                    "include[{index}] '{name}' is not served; served: {served}",
                    index=index,
                    name=name,
                    served=", ".join(sorted({LOGPROBS_INCLUDE, *_EMPTY_INCLUDES})),
                )
        return value

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or ())


def request_error(exc: ValidationError) -> ChatCompletionError:
    """Every problem of ``exc`` as one OpenAI error, naming the first one's field."""
    problems = [_problem(e) for e in exc.errors(include_url=False)]
    first_param, first_code, _ = problems[0]
    if first_code == "invalid_json":
        return ChatCompletionError(problems[0][2], code="invalid_json")
    message = problems[0][2]
    if len(problems) > 1:
        message += " Also: " + " ".join(p[2] for p in problems[1:])
    return ChatCompletionError(message, param=first_param, code=first_code)


def _problem(error: Any) -> tuple[str | None, str, str]:
    param = _param(error["loc"])
    kind, msg = error["type"], str(error["msg"])
    where = f"'{param}'" if param else "the body"
    if kind == "extra_forbidden":
        why = _REFUSED_FIELDS.get(param or "", "this server does not take it")
        return (
            param,
            "unsupported_parameter",
            f"Unsupported parameter: '{param}': {why}; remove it.",
        )
    if kind == "missing":
        return param, "missing_required_parameter", f"Missing required parameter: '{param}'."
    if kind == "json_invalid":
        return None, "invalid_json", f"The body is not valid JSON: {msg}."
    if kind in ("unsupported_value", "unsupported_item"):
        return param, "unsupported_value", f"Unsupported value for {where}: {msg}."
    return param, "invalid_value", f"Invalid value for {where}: {msg[:1].lower() + msg[1:]}."


_TAGS = frozenset({"message", "assistant", *_ITEM_TYPES, "function-after[_function_tool()]"})


def _param(loc: tuple[int | str, ...]) -> str | None:
    """``('input', 2, 'function_call', 'call_id')`` -> ``input[2].call_id``."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i >= 2 and isinstance(loc[i - 1], int) and (part in _TAGS or "[" in part):
            continue  # a union's branch, not a field
        else:
            out += f".{part}" if out else part
    return out.replace("schema_", "schema") or None


def parse_responses_request(body: bytes | str | Mapping[str, Any]) -> ResponsesRequest:
    """The request, or `ChatCompletionError` naming each field that is wrong."""
    try:
        if isinstance(body, bytes | str):
            return ResponsesRequest.model_validate_json(body)
        return ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        raise request_error(exc) from None


__all__ = [
    "LOGPROBS_INCLUDE",
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "FunctionTool",
    "InputItem",
    "InputMessage",
    "NamedFunction",
    "OutputMessage",
    "ReasoningItem",
    "ResponsesRequest",
    "TextConfig",
    "parse_responses_request",
    "request_error",
]
