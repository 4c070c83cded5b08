"""The environment webhook protocol (v1): every body, as pydantic models (pure pydantic).

docs/environment-protocol.md describes the protocol for authors in any
language; its JSON Schemas (``docs/schemas/``) are generated from these
models by ``scripts/protocol_schemas.py``.

Who parses what:

- ``rl_core.envs.webhook`` (the worker) sends the requests and validates the
  environment's answers with `ResetAnswer`, `StepAnswer`, `DeferredAnswer`;
- ``sdk.envserver`` (the author-side helper) parses the requests with
  `ResetRequest`, `StepRequest`, `CloseRequest`;
- the ``webhook`` verifier (``rl_core.envs.scorer``) sends `ScoreRequest` to a
  registered scorer endpoint and validates its `ScoreAnswer`;
- the control plane validates a deferred result posted to
  ``/v1/env-callbacks/{episode_id}/{step}`` as a `CallbackBody` (a step answer or
  an error, naming the step it answers: `BoundToStep`).

Tolerance: answers are written by environment authors in any language, and
requests may gain optional fields within v1, so **unknown fields are ignored**
everywhere (never an error), with one exception: a message keeps its unknown
fields (``name``, say) and passes them to the chat template as they are.
Known fields are strict: a ``reward`` of ``"1"`` or ``true`` is not a number,
a ``done`` of ``1`` is not a boolean, a reward must be finite.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)

VERSION = "v1"


def _none_is_empty_object(value: Any) -> Any:
    return {} if value is None else value


def _none_is_empty_list(value: Any) -> Any:
    return [] if value is None else value


# ``null`` and absent mean the same: nothing.
Info = Annotated[dict[str, Any], BeforeValidator(_none_is_empty_object)]
Config = Annotated[dict[str, Any], BeforeValidator(_none_is_empty_object)]
EpisodeId = Annotated[StrictStr, Field(min_length=1, max_length=300)]
# The worker numbers an episode's steps 1, 2, 3, ... (the agent's turn); 0 is never a step.
StepNumber = Annotated[StrictInt, Field(ge=1, le=2**31 - 1)]
# Seeds come from `rl_core.pipeline.collector.derive_seed`: 31 bits, never negative.
Seed = Annotated[StrictInt, Field(ge=0, le=2**31 - 1)]


class Tolerant(BaseModel):
    """Unknown fields are ignored: v1 may add optional fields; other servers may send more."""

    model_config = ConfigDict(extra="ignore")


# --- what rlaas sends the environment --------------------------------------------------


class ResetRequest(Tolerant):
    """``POST {url}/reset``: start episode ``episode_id``."""

    episode_id: EpisodeId
    seed: Seed  # the same for every member of a group: one game, several attempts
    config: Config = Field(default_factory=dict)  # the spec's environment.config, as written


class ToolCall(Tolerant):
    id: StrictStr
    name: StrictStr
    arguments: dict[str, Any]


class Action(Tolerant):
    """The assistant's message: its text, and the tool calls parsed from it (maybe none)."""

    content: StrictStr
    tool_calls: Annotated[list[ToolCall], BeforeValidator(_none_is_empty_list)] = Field(
        default_factory=list
    )


class StepRequest(Tolerant):
    """``POST {url}/step``: apply the action. ``(episode_id, step)`` is the idempotency key."""

    episode_id: EpisodeId
    step: StepNumber  # 1 for the first action after the reset, then 2, 3, ...
    action: Action


class CloseRequest(Tolerant):
    """``POST {url}/close``: the episode is over (sent once per reset, whatever happened)."""

    episode_id: EpisodeId


# --- what the environment answers -----------------------------------------------------


class Message(BaseModel):
    """A chat message. Unknown fields are kept and reach the chat template as they are."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: StrictStr
    tool_call_id: StrictStr | None = None  # on a tool message: the ToolCall.id it answers


class ResetMessage(Message):
    role: Literal["system", "user"]


class StepMessage(Message):
    role: Literal["tool", "user"]


class ResetAnswer(Tolerant):
    """200 to ``/reset``: the opening messages, the tools the model may call, and info."""

    messages: list[ResetMessage]
    # Tool definitions in the OpenAI function format: {"type": "function", "function": {...}}.
    tools: Annotated[list[dict[str, Any]], BeforeValidator(_none_is_empty_list)] = Field(
        default_factory=list
    )
    info: Info = Field(default_factory=dict)


class StepAnswer(Tolerant):
    """200 to ``/step`` (or the body of a deferred result): what the action led to."""

    messages: Annotated[list[StepMessage], BeforeValidator(_none_is_empty_list)] = Field(
        default_factory=list
    )
    reward: float = Field(strict=True, allow_inf_nan=False)
    done: StrictBool
    info: Info = Field(default_factory=dict)


class DeferredAnswer(Tolerant):
    """202 to ``/step``: the result will be POSTed to the callback route when it is ready."""

    deferred: Literal[True]


class CloseAnswer(Tolerant):
    """200 to ``/close``. Any JSON object will do; its fields are not read."""

    closed: bool = True


# --- the `webhook` verifier: a scorer endpoint (docs/environment-protocol.md#scoring) ---


class ScoreRequest(Tolerant):
    """``POST {url}/score``: score one finished episode (the ``webhook`` verifier)."""

    episode_id: EpisodeId
    # The episode's opening messages (system and user), as the environment gave them.
    prompt: list[Message]
    completion: StrictStr  # the assistant's final message
    # Every assistant message of the episode, in order (the last is ``completion``).
    contents: list[StrictStr]
    answer: Any = None  # the reference answer (reset info["answer"]), or null
    info: Info = Field(default_factory=dict)  # the episode's reset and step infos, merged


class ScoreAnswer(Tolerant):
    """200 to ``/score``: the episode's score (the term's value before its weight)."""

    score: float = Field(strict=True, allow_inf_nan=False)
    info: Info = Field(default_factory=dict)


class ErrorDetail(Tolerant):
    code: str = ""
    message: StrictStr


class ErrorAnswer(Tolerant):
    """A 4xx/5xx answer (``message`` is shown in the worker's log and the episode's end
    reason), or a deferred step that failed (posted to the callback route)."""

    error: ErrorDetail


class BoundToStep(Tolerant):
    """Which step a deferred result answers: ``episode_id`` and ``step`` of its ``/step``
    request, which must equal the callback URL's. They are in the body so that the
    signature covers them: a captured post cannot be replayed onto another step."""

    episode_id: EpisodeId
    step: StepNumber


class CallbackResult(StepAnswer, BoundToStep):
    """A deferred step's result, posted to the callback route."""


class CallbackFailure(ErrorAnswer, BoundToStep):
    """A deferred step that failed after its 202, posted to the callback route."""


# ``POST /v1/env-callbacks/{episode_id}/{step}``: the result, or the step's failure.
CallbackBody = CallbackResult | CallbackFailure
CALLBACK_BODY: TypeAdapter[CallbackResult | CallbackFailure] = TypeAdapter(CallbackBody)


class CallbackAccepted(Tolerant):
    """202 to the callback route: the result is stored and relayed to the waiting worker."""

    accepted: bool


def parse_callback(body: Any) -> StepAnswer | ErrorAnswer:
    """A deferred result: a failure if it has an ``error``, else a step answer.

    The worker's view: the control plane checked the step binding when the result
    was posted (`parse_bound_callback`). Raises `pydantic.ValidationError` (see
    `problems`) when it is neither.
    """
    if isinstance(body, dict) and "error" in body:
        return ErrorAnswer.model_validate(body)
    return StepAnswer.model_validate(body)


def parse_bound_callback(body: Any) -> CallbackResult | CallbackFailure:
    """A posted deferred result, with the step it answers (`BoundToStep`).

    Raises `pydantic.ValidationError` (see `problems`) when it is neither shape.
    """
    if isinstance(body, dict) and "error" in body:
        return CallbackFailure.model_validate(body)
    return CallbackResult.model_validate(body)


def problems(exc: ValidationError) -> str:
    """The errors of ``exc`` in one line, each naming its field by its JSON path.

    ``'messages.0.role': input should be 'tool' or 'user'``; a missing field whose
    type is a plain class says which: ``'seed' must be a int: field required``.
    """
    model = exc.title
    parts = []
    for error in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in error["loc"]) or "(the body)"
        message = str(error["msg"])
        message = message[:1].lower() + message[1:]
        if error["type"] == "missing":
            kind = _plain_type(model, error["loc"])
            parts.append(f"'{loc}' must be a {kind}: {message}" if kind else f"'{loc}': {message}")
        else:
            parts.append(f"'{loc}': {message}")
    return "; ".join(parts)


_MODELS: dict[str, type[BaseModel]] = {}


def _plain_type(title: str, loc: tuple[int | str, ...]) -> str | None:
    model: Any = _MODELS.get(title)
    for i, part in enumerate(loc):
        fields = getattr(model, "model_fields", None)
        if not isinstance(part, str) or fields is None or part not in fields:
            return None
        annotation = fields[part].annotation
        if i == len(loc) - 1:
            return annotation.__name__ if annotation in (int, str, float, bool) else None
        model = annotation
    return None


for _model in (
    ResetRequest,
    StepRequest,
    CloseRequest,
    Action,
    ToolCall,
    BoundToStep,
    CallbackResult,
    CallbackFailure,
    ScoreAnswer,
):
    _MODELS[_model.__name__] = _model

# The bodies of the protocol, by the name their JSON Schema file has (docs/schemas/).
BODIES: dict[str, Any] = {
    "reset-request": ResetRequest,
    "reset-answer": ResetAnswer,
    "step-request": StepRequest,
    "step-answer": StepAnswer,
    "step-deferred-answer": DeferredAnswer,
    "close-request": CloseRequest,
    "close-answer": CloseAnswer,
    "error-answer": ErrorAnswer,
    "callback-body": CALLBACK_BODY,
    "callback-accepted": CallbackAccepted,
    "score-request": ScoreRequest,
    "score-answer": ScoreAnswer,
}


def json_schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schema of each body, by name: what docs/schemas/<name>.json holds."""
    out = {}
    for name, body in BODIES.items():
        schema = body.json_schema() if isinstance(body, TypeAdapter) else body.model_json_schema()
        out[name] = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"{name}.json",
            **schema,
        }
        out[name].setdefault("title", name)
    return out


__all__ = [
    "BODIES",
    "CALLBACK_BODY",
    "VERSION",
    "Action",
    "BoundToStep",
    "CallbackAccepted",
    "CallbackBody",
    "CallbackFailure",
    "CallbackResult",
    "CloseAnswer",
    "CloseRequest",
    "DeferredAnswer",
    "ErrorAnswer",
    "ErrorDetail",
    "Message",
    "ResetAnswer",
    "ResetMessage",
    "ResetRequest",
    "ScoreAnswer",
    "ScoreRequest",
    "StepAnswer",
    "StepMessage",
    "StepRequest",
    "ToolCall",
    "json_schemas",
    "parse_bound_callback",
    "parse_callback",
    "problems",
]
