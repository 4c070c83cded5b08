"""The legacy text-completions request (``POST /completions``), and what is not served.

The client owns the formatting: the prompt is text, encoded with the run's tokenizer
as it is, with no chat template (`rl_core.sessions.session.ChatSession.complete_text`).
Refusals are OpenAI's error body, as for chat completions (`ChatCompletionError`, every
problem named by its field, ``code`` the first's kind):

- ``unsupported_parameter``: a field this server does not know (refused, not ignored);
- ``unsupported_value``: ``prompt`` as token ids, or as several prompts (a session is
  one conversation, and it encodes text itself); ``echo: true`` (the prompt's logprobs
  are not computed); ``suffix`` (insertion needs a model trained to fill in the
  middle); ``n`` or ``best_of`` other than 1 (a session is one member of its group:
  open that many sessions with one group name); ``logit_bias`` with entries;
  ``stream_options`` without ``stream``;
- ``missing_required_parameter`` and ``invalid_value`` for the rest.

Taken as OpenAI documents them: ``model`` (echoed back), ``prompt`` (a non-empty
string, or a list of one), ``max_tokens`` (16 when left out, OpenAI's default for this
route; the run's own limits may end the answer sooner, with ``finish_reason:
"length"``), ``temperature``, ``top_p``, ``frequency_penalty``, ``presence_penalty``
and vLLM's ``top_k`` (within the run's bounds: checked by the session), ``stop`` (as
in chat completions: the sampled tokens are cut at the one that completes the string,
`rl_core.sessions.stop`), ``n: 1``, ``best_of: 1``, ``echo: false``, ``logprobs`` 0
to 5 (each returned token, its logprob as sampled, and as its ``top_logprobs`` entry
the ``logprobs`` most likely tokens and the sampled one: OpenAI always adds the
sampled token), ``stream`` with ``stream_options.include_usage``, ``seed``. Accepted
and ignored: ``user``, ``logit_bias: {}``. Types are strict, as in chat completions.
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

from rl_core.protocol.chat_completions.request import (
    Penalty,
    Stop,
    StreamOptions,
    request_error,
)

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
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = None  # vLLM's; -1 and 0 are off
    frequency_penalty: Penalty = None
    presence_penalty: Penalty = None
    stop: Stop = None
    n: StrictInt | None = None
    best_of: StrictInt | None = None
    logprobs: Annotated[StrictInt, Field(ge=0, le=5)] | None = None
    echo: StrictBool | None = None
    suffix: StrictStr | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    seed: StrictInt | None = None
    user: StrictStr | None = None  # accepted, no effect here
    logit_bias: dict[str, Any] | None = None

    @field_validator("n", "best_of")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise _unsupported(
                "a session is one member of its GRPO group, so it answers one choice; for "
                "several samples of one prompt open that many sessions with the same group "
                "name (POST /v1/sessions with {'group': ...}); send 1"
            )
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value:
            raise _unsupported(
                "it changes the sampling distribution, which the engines do not serve; send "
                "an empty object or leave it out"
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
    """The request, or `ChatCompletionError` naming every field that is wrong."""
    try:
        if isinstance(body, bytes | str):
            return CompletionRequest.model_validate_json(body)
        return CompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise request_error(exc) from None


__all__ = ["DEFAULT_MAX_TOKENS", "CompletionRequest", "parse_completion_request"]
