"""`WebhookScorer`: the ``webhook`` verifier's client, a registered endpoint's ``/score``.

A scorer endpoint is a server registered like an environment (``POST
/v1/environments``: its URL through the same address checks, its secret encrypted)
that answers ``POST {url}/score`` (docs/environment-protocol.md#scoring). The
requests go through a `WebhookEnvironment` of that target, so they are signed,
retried, limited and counted exactly as an environment's; only the route and the
bodies differ. A call that fails raises `CheckFailed` with the reason it is counted
under (``env/verifier_failed/webhook/<reason>``): the episode fails, it is never
scored 0 for the endpoint's fault.
"""

from __future__ import annotations

from rl_core.envs.errors import (
    CircuitOpen,
    WebhookAddressRefused,
    WebhookError,
    WebhookProtocolError,
    WebhookRejected,
)
from rl_core.envs.transport import TransportFactory
from rl_core.envs.webhook import WebhookEnvironment, WebhookTarget
from rl_core.protocol import webhook as wire
from rl_core.rewards import CheckFailed, RewardContext
from rl_core.spec import WebhookCallSpec

# Why a /score call failed, as counted (`CheckFailed.reason`).
SCORER_REASONS = ("unavailable", "rejected", "bad_answer", "address_refused", "circuit_open")


class WebhookScorer:
    """One per run; ``deadline_s`` bounds one episode's score, retries included."""

    def __init__(
        self,
        target: WebhookTarget,
        *,
        policy: WebhookCallSpec | None = None,
        deadline_s: float = 25.0,
        transport: TransportFactory | None = None,
    ) -> None:
        self.client = WebhookEnvironment(target, policy=policy, transport=transport)
        self.deadline_s = deadline_s

    async def __call__(self, ctx: RewardContext) -> float:
        request = wire.ScoreRequest(
            episode_id=ctx.episode_id or "-",
            prompt=[wire.Message.model_validate(m) for m in ctx.prompt if _plain(m)],
            completion=ctx.final,
            contents=list(ctx.contents),
            answer=ctx.reference,
            info=ctx.info,
        )
        try:
            answer = await self.client.call("score", request, wire.ScoreAnswer, self.deadline_s)
        except WebhookError as exc:
            raise CheckFailed(_reason(exc), str(exc)) from exc
        return answer.score

    async def aclose(self) -> None:
        await self.client.aclose()

    def step_metrics(self) -> dict[str, float]:
        """The client's ``env/`` metrics (faults by reason, limit, breaker) as
        ``env/scorer/...``: the endpoint's health apart from the environment's."""
        return {
            f"env/scorer/{key.removeprefix('env/')}": value
            for key, value in self.client.step_metrics().items()
        }


def _plain(message: object) -> bool:
    # A message whose content is not text (none, or parts) is not sent: the body's
    # ``prompt`` is text messages only.
    return isinstance(message, dict) and isinstance(message.get("content"), str)


def _reason(exc: WebhookError) -> str:
    if isinstance(exc, WebhookProtocolError):
        return "bad_answer"
    if isinstance(exc, WebhookRejected):
        return "rejected"
    if isinstance(exc, WebhookAddressRefused):
        return "address_refused"
    if isinstance(exc, CircuitOpen):
        return "circuit_open"
    return "unavailable"


__all__ = ["SCORER_REASONS", "WebhookScorer"]
