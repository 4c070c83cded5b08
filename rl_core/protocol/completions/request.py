"""The legacy text-completions request (``POST /completions``), and what is not served.

The client owns the formatting: the prompt is text, encoded with the run's tokenizer
as it is, with no chat template (`rl_core.sessions.session.ChatSession.complete_text`).
Refusals are OpenAI's error body, as for chat completions (`ChatCompletionError`,
named by field, ``code`` saying which kind):

- ``unsupported_parameter``: a field this server does not take (``frequency_penalty``,
  ``presence_penalty``, ``logit_bias``, ``user``, ...);
- ``unsupported_value``: ``prompt`` as token ids, or as several prompts (a session is
  one conversation, and it encodes text itself); ``logprobs`` above 0 (the engine
  returns only the sampled token's logprob, not the most likely ones); ``echo: true``
  (the prompt's logprobs are not computed); ``suffix`` (insertion needs a model trained
  to fill in the middle); ``n`` or ``best_of`` other than 1 (a session is one
  trajectory); ``stream_options`` without ``stream``;
- ``missing_required_parameter`` and ``invalid_value`` for the rest.

Taken as OpenAI documents them: ``model`` (echoed back), ``prompt`` (a non-empty
string, or a list of one), ``max_tokens`` (16 when left out, OpenAI's default for this
route; the run's own limits may end the answer sooner, with ``finish_reason:
"length"``), ``temperature`` and ``top_p`` (they must equal the run's sampler: checked
by the session), ``stop`` (as in chat completions: the sampled tokens are cut at the
one that completes the string, `rl_core.sessions.stop`), ``n: 1``, ``best_of: 1``,
``echo: false``, ``logprobs: 0`` (each returned token, its logprob under the run's
sampler, and as its ``top_logprobs`` entry the sampled token alone: OpenAI returns
the sampled token's logprob besides the ``logprobs`` most likely, so with 0 it is the
only one), ``stream`` with ``stream_options.include_usage``, ``seed``. Types are
strict, as in chat completions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from rl_core.protocol.chat_completions.request import Stop, StreamOptions, request_error

DEFAULT_MAX_TOKENS = 16  # OpenAI's, for this route


def _unsupported(message: str) -> PydanticCustomError:
    return PydanticCustomError("unsupported_value", message, {})


def _one_prompt(value: Any) -> Any:
    """A string, or a list of one string; token ids and several prompts are refused."""
    if not isinstance(value, list):
        return value
    if any(isinstance(v, int | list) and not isinstance(v, bool) for v in value):
        raise _unsupported(
            "token-id prompts are not served: the session encodes the prompt's text with "
            "the run's tokenizer; send the text"
        )
    if len(value) > 1:
        raise PydanticCustomError(
            "unsupported_value",
            "a session is one conversation: send one prompt per call, not {count}",
            {"count": len(value)},
        )
    if len(value) == 0:
        raise PydanticCustomError("invalid_value", "the prompt is empty", {})
    return value[0]


Prompt = Annotated[StrictStr, Field(min_length=1), BeforeValidator(_one_prompt)]


class CompletionRequest(BaseModel):
    """``POST /completions``: see the module docstring for what is served."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    model: StrictStr
    prompt: Prompt
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stop: Stop = None
    n: StrictInt | None = None
    best_of: StrictInt | None = None
    logprobs: Annotated[StrictInt, Field(ge=0, le=5)] | None = None
    echo: StrictBool | None = None
    suffix: StrictStr | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    seed: StrictInt | None = None

    @field_validator("n", "best_of")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise _unsupported("a session is one trajectory: it must be 1")
        return value

    @field_validator("logprobs")
    @classmethod
    def _sampled_only(cls, value: int | None) -> int | None:
        if value:
            raise _unsupported(
                "the engine returns only the sampled token's logprob, not the most likely "
                "tokens'; send 0 to get the sampled tokens' logprobs"
            )
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool | None) -> bool | None:
        if value:
            raise _unsupported("echo needs the prompt's logprobs, which the engine does not give")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value is not None:
            raise _unsupported("insertion needs a model trained to fill in the middle; send null")
        return value

    @field_validator("stream_options")
    @classmethod
    def _streaming(cls, value: StreamOptions | None, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("stream"):
            raise _unsupported("stream_options needs stream: true")
        return value

    @property
    def token_limit(self) -> int:
        """The most completion tokens the client accepts (OpenAI's 16 when not given)."""
        return DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens


def parse_completion_request(body: bytes | str | Mapping[str, Any]) -> CompletionRequest:
    """The request, or `ChatCompletionError` naming the first field that is wrong."""
    try:
        if isinstance(body, bytes | str):
            return CompletionRequest.model_validate_json(body)
        return CompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise request_error(exc) from None


__all__ = ["DEFAULT_MAX_TOKENS", "CompletionRequest", "parse_completion_request"]
