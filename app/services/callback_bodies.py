"""What a posted deferred result must be before it is stored: signed, a JSON object, bound
to the step it is posted to, and a step answer or a failure (rl_core.protocol.webhook).

The binding is the point: the signature covers the body, not the URL, so the body
names its ``episode_id`` and ``step`` and they must be the URL's. Otherwise a
captured post, its signature good for five minutes, would answer any other step of
any episode on the same environment.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from app.errors import Forbidden, Unauthorized, Unprocessable
from rl_core.protocol.signing import HEADER, SignatureError, verify
from rl_core.protocol.webhook import BoundToStep, parse_bound_callback, problems

GUIDE = "see 'Deferred results' in docs/environment-protocol.md"


def authentic_body(
    secret: str, raw: bytes, signature: str | None, episode_id: str, step: int
) -> dict[str, Any]:
    """The body, as posted, once it is shown to be the environment's result for this step."""
    try:
        verify(secret, raw, signature)
    except SignatureError as exc:
        raise Unauthorized(
            f"{exc}; sign the raw body with the environment's secret", field=HEADER
        ) from None
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise Unprocessable(f"body is not valid JSON: {exc}", field="body") from None
    if not isinstance(body, dict):
        raise Unprocessable("body must be a JSON object (the step's result)", field="body")
    _check_bound(body, episode_id, step)
    try:
        parse_bound_callback(body)  # stored as posted; the worker parses it again when it takes it
    except ValidationError as exc:
        raise Unprocessable(
            f"the body is neither a step answer {{episode_id, step, messages, reward, done, "
            f"info}} nor a failure {{episode_id, step, error: {{code, message}}}}: "
            f"{problems(exc)}",
            field="body",
        ) from None
    return body


def _check_bound(body: dict[str, Any], episode_id: str, step: int) -> None:
    missing = [name for name in ("episode_id", "step") if name not in body]
    if missing:
        # The form from before results were bound to their step: say what to add.
        raise Unprocessable(
            f"the signed body must name the step it answers: add "
            f'"episode_id": {json.dumps(episode_id)} and "step": {step} (those of the /step '
            f"request) beside the result; a callback without them is refused ({GUIDE})",
            field=missing[0],
        )
    try:
        bound = BoundToStep.model_validate(body)
    except ValidationError as exc:
        field = str(exc.errors()[0]["loc"][0])
        raise Unprocessable(f"{problems(exc)} ({GUIDE})", field=field) from None
    if bound.episode_id != episode_id:
        raise Forbidden(
            f"the result is signed for episode {bound.episode_id}, not {episode_id}: a "
            "result answers only the episode and step it names (a replayed post is refused)",
            field="episode_id",
        )
    if bound.step != step:
        raise Forbidden(
            f"the result is signed for step {bound.step}, not step {step} of episode "
            f"{episode_id}: a result answers only the step it names (a replayed post is "
            "refused)",
            field="step",
        )
