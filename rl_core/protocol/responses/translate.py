"""A Responses request as a chat-completions request, and the chat answer as a Response.

The Responses API is served by the chat core (`rl_core.sessions`): one rendering, one
sampler, one ledger. So a Responses call and a chat call of the same conversation see
the same prompt tokens, and a session may mix them.

- ``instructions`` is a system message first (not kept by ``previous_response_id``,
  as OpenAI documents);
- the history of ``previous_response_id`` (its input and its answer, as chat messages)
  comes next, then ``input``'s items in order: a message is a message; an assistant
  message and the ``function_call`` items after it are one assistant message with
  ``tool_calls`` (the shape the session answered in, so an echoed answer is rendered
  from the text the model sampled); a ``function_call_output`` is a tool message;
  a ``reasoning`` item is dropped;
- function tools become chat tools, ``tool_choice`` a named function in chat's shape,
  ``text.format`` ``response_format``, ``max_output_tokens`` ``max_completion_tokens``,
  ``top_logprobs`` with the logprobs include ``logprobs``/``top_logprobs``.

The chat request is validated by the chat core (`parse_request`); what it refuses is
renamed to the Responses field (`chat_error`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from rl_core.protocol.chat_completions import (
    ChatCompletion,
    ChatCompletionError,
    ChatCompletionRequest,
    parse_request,
)
from rl_core.protocol.responses.answer import (
    FunctionCallOutput,
    IncompleteDetails,
    OutputLogprob,
    OutputMessageItem,
    OutputText,
    Response,
    ResponseUsage,
    TopLogprob,
)
from rl_core.protocol.responses.request import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputMessage,
    OutputMessage,
    ResponsesRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
)


def input_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """``input`` as chat messages (the ``instructions`` and history not included)."""
    out: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None  # the assistant message being gathered

    def flush() -> None:
        nonlocal turn
        if turn is not None:
            out.append(turn)
            turn = None

    for item in request.input:
        if isinstance(item, OutputMessage):
            flush()
            turn = {"role": "assistant", "content": item.content}
        elif isinstance(item, FunctionCallItem):
            if turn is None:
                turn = {"role": "assistant", "content": None}
            call = {"name": item.name, "arguments": item.arguments}
            turn.setdefault("tool_calls", []).append(
                {"id": item.call_id, "type": "function", "function": call}
            )
        elif isinstance(item, FunctionCallOutputItem):
            flush()
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        elif isinstance(item, InputMessage):
            flush()
            out.append({"role": item.role, "content": item.content})
        # A reasoning item: another model's, not rendered (see the request's docstring).
    flush()
    return out


def to_chat(
    request: ResponsesRequest, history: Sequence[dict[str, Any]] = ()
) -> tuple[ChatCompletionRequest, list[dict[str, Any]]]:
    """The chat request, and the conversation to keep for a later ``previous_response_id``
    (history + input, no instructions; the caller appends the answer)."""
    conversation = [*history, *input_messages(request)]
    messages = list(conversation)
    if request.instructions:
        messages.insert(0, {"role": "system", "content": request.instructions})
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": tool.model_dump(exclude={"type"}, exclude_none=True),
            }
            for tool in request.tools
        ]
    choice = request.tool_choice
    if choice is not None:
        body["tool_choice"] = (
            choice
            if isinstance(choice, str)
            else {"type": "function", "function": {"name": choice.name}}
        )
    fmt = request.text.format if request.text else None
    if isinstance(fmt, TextFormatJsonSchema):
        schema: dict[str, Any] = {"name": fmt.name, "schema": fmt.schema_}
        if fmt.description is not None:
            schema["description"] = fmt.description
        if fmt.strict is not None:
            schema["strict"] = fmt.strict
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(fmt, TextFormatJsonObject):
        body["response_format"] = {"type": "json_object"}
    for ours, theirs in (
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("max_output_tokens", "max_completion_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
    ):
        value = getattr(request, ours)
        if value is not None:
            body[theirs] = value
    if request.wants_logprobs:
        body["logprobs"] = True
        if request.top_logprobs:
            body["top_logprobs"] = request.top_logprobs
    try:
        return parse_request(body), conversation
    except ChatCompletionError as exc:
        raise chat_error(exc, request) from None


# Chat fields -> the Responses fields they were made from.
_RENAMES = (
    (re.compile(r"^tools\[(\d+)\]\.function\."), r"tools[\1]."),
    (re.compile(r"^tool_choice\.function\."), "tool_choice."),
    (re.compile(r"^response_format\.json_schema\."), "text.format."),
    (re.compile(r"^response_format"), "text.format"),
    (re.compile(r"^max_completion_tokens"), "max_output_tokens"),
    (re.compile(r"^messages(\[\d+\])?"), "input"),
    (re.compile(r"^logprobs"), "include"),
)


def chat_error(exc: ChatCompletionError, request: ResponsesRequest) -> ChatCompletionError:
    """The chat core's refusal, each field it names renamed to the Responses field it came
    from (the chat request's message indices are not the input's item indices, so a
    message is named ``input``)."""
    if exc.param is None:
        return exc
    message = _QUOTED.sub(lambda m: f"'{_renamed(m.group(1))}'", exc.message)
    return ChatCompletionError(
        message, param=_renamed(exc.param), code=exc.code, status=exc.status, type=exc.type
    )


_QUOTED = re.compile(r"'([A-Za-z_][\w.\[\]]*)'")


def _renamed(param: str) -> str:
    for pattern, replacement in _RENAMES:
        param = pattern.sub(replacement, param)
    return param


def from_chat(
    completion: ChatCompletion,
    request: ResponsesRequest,
    *,
    response_id: str,
    item_prefix: str,
) -> Response:
    """The chat answer as a ``response`` object (the request's settings echoed back)."""
    (choice,) = completion.choices
    message = choice.message
    output: list[OutputMessageItem | FunctionCallOutput] = []
    if message.content is not None:
        logprobs = None
        if request.wants_logprobs and choice.logprobs is not None:
            logprobs = [
                OutputLogprob(
                    token=t.token,
                    logprob=t.logprob,
                    bytes=t.bytes or [],
                    top_logprobs=[_top(x) for x in t.top_logprobs],
                )
                for t in choice.logprobs.content or ()
            ]
        text = OutputText(text=message.content, logprobs=logprobs)
        output.append(OutputMessageItem(id=f"msg_{item_prefix}", content=[text]))
    for i, call in enumerate(message.tool_calls or ()):
        output.append(
            FunctionCallOutput(
                id=f"fc_{item_prefix}_{i}",
                call_id=call.id,
                name=call.function.name,
                arguments=call.function.arguments,
            )
        )
    incomplete = choice.finish_reason == "length"
    usage = completion.usage
    return Response(
        id=response_id,
        created_at=completion.created,
        completed_at=None if incomplete else completion.created,
        status="incomplete" if incomplete else "completed",
        incomplete_details=IncompleteDetails(reason="max_output_tokens") if incomplete else None,
        model=request.model,
        output=output,
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        metadata=request.metadata or {},
        parallel_tool_calls=request.parallel_tool_calls is not False,
        previous_response_id=request.previous_response_id,
        store=request.store is not False,
        temperature=request.temperature,
        top_p=request.top_p,
        top_logprobs=request.top_logprobs,
        tool_choice=_echo_choice(request),
        tools=[t.model_dump(exclude_none=True) for t in request.tools or ()],
        text=request.text.model_dump(by_alias=True, exclude_none=True)
        if request.text and request.text.format
        else {"format": {"type": "text"}},
        user=request.user,
        usage=ResponseUsage.of(usage.prompt_tokens, usage.completion_tokens),
    )


def _top(entry: Any) -> TopLogprob:
    if isinstance(entry, dict):
        return TopLogprob(
            token=entry["token"], logprob=entry["logprob"], bytes=entry.get("bytes") or []
        )
    return TopLogprob(token=entry.token, logprob=entry.logprob, bytes=entry.bytes or [])


def _echo_choice(request: ResponsesRequest) -> Any:
    choice = request.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump()


__all__ = ["chat_error", "from_chat", "input_messages", "to_chat"]
