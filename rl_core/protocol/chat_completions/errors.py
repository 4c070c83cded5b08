"""OpenAI's error body, and a refused request's problems, every one of them, in it.

OpenAI's body has one ``message`` and one ``param``: ``{"error": {"message", "type",
"param", "code"}}``. A request with several problems names them all in the message
(numbered, each with its field), and ``param`` and ``code`` are the first's, so a
client fixes everything in one round rather than meeting the problems one by one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError


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


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a request: its field (a JSON path), what is wrong, which kind."""

    param: str | None
    message: str  # a sentence, ending with a full stop
    code: str  # unsupported_parameter, unsupported_value, missing_required_parameter, ...


def refusal(problems: Sequence[Problem], *, status: int = 400) -> ChatCompletionError:
    """One error naming every problem; ``param`` and ``code`` are the first's."""
    if not problems:
        raise ValueError("a refusal needs at least one problem")
    first = problems[0]
    if len(problems) == 1:
        message = first.message
    else:
        listed = " ".join(f"({i}) {p.message}" for i, p in enumerate(problems, 1))
        message = f"This request has {len(problems)} problems: {listed}"
    return ChatCompletionError(message, param=first.param, code=first.code, status=status)


def unsupported(message: str, **context: Any) -> PydanticCustomError:
    """A validator's refusal of a value this server takes the field of but cannot honour."""
    return PydanticCustomError("unsupported_value", message, context)


def invalid(message: str, **context: Any) -> PydanticCustomError:
    return PydanticCustomError("invalid_value", message, context)


# Why some well-known OpenAI fields are refused, so the message says what to change.
REFUSED_FIELDS = {
    "functions": "the deprecated functions API is not served; use tools",
    "function_call": "the deprecated functions API is not served; use tool_choice",
    "prediction": "predicted outputs are not served",
    "web_search_options": "there is no web search here",
    "audio": "audio output is not served",
}
_UNKNOWN = (
    "this server does not know it (unknown fields are refused rather than ignored: an "
    "ignored sampling or format option would quietly change the answer); remove it"
)


def request_error(exc: ValidationError) -> ChatCompletionError:
    """Every problem of ``exc`` as one OpenAI error, each naming its field by JSON path."""
    errors = exc.errors(include_url=False)
    if any(e["type"] == "json_invalid" for e in errors):
        msg = next(str(e["msg"]) for e in errors if e["type"] == "json_invalid")
        return ChatCompletionError(f"The body is not valid JSON: {msg}.", code="invalid_json")
    return refusal([_problem(e["type"], e["loc"], str(e["msg"])) for e in errors])


def _problem(kind: str, loc: tuple[int | str, ...], msg: str) -> Problem:
    param = _param(loc)
    if kind == "extra_forbidden":
        why = REFUSED_FIELDS.get(param or "", _UNKNOWN)
        return Problem(param, f"Unsupported parameter: '{param}': {why}.", "unsupported_parameter")
    if kind == "missing":
        return Problem(
            param, f"Missing required parameter: '{param}'.", "missing_required_parameter"
        )
    if kind == "invalid_role":
        param = f"{param}.role"
        return Problem(param, f"Invalid value for '{param}': {msg}.", "invalid_value")
    if kind == "unsupported_value":
        return Problem(param, f"Unsupported value for '{param}': {msg}.", "unsupported_value")
    where = f"'{param}'" if param else "the body"
    return Problem(
        param, f"Invalid value for {where}: {msg[:1].lower() + msg[1:]}.", "invalid_value"
    )


_ROLE_TAGS = frozenset({"system", "user", "assistant", "tool"})
# Branches of tagged unions that are not fields: pydantic puts them in the path.
_BRANCHES = frozenset({"text", "json_object", "json_schema", "function-after[_tool_choice()]"})


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
        elif i == 1 and loc[0] == "response_format" and part in _BRANCHES:
            continue
        else:
            out += f".{part}" if out else part
    return out or None


__all__ = [
    "REFUSED_FIELDS",
    "ChatCompletionError",
    "Problem",
    "invalid",
    "refusal",
    "request_error",
    "unsupported",
]
