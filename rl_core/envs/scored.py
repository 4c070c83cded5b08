"""`Scored`: an environment whose reward is replaced by functions attached by name.

A reward function (a verifier) that raises or passes ``timeout_s`` fails the episode
(``env_error``: removed from its group, never scored 0 for the checker's fault) and is
counted by name and reason in the ``env/verifier_failed/<name>/<reason>`` metrics. The
``webhook`` verifier calls the run's scorer endpoint (``scorer``), whose request counts
are reported as ``env/scorer/...``.

A group term (``judge``) is not scored at the episode's end: the episode's answer is
kept (`JudgeItem`) until its group has ended, then `judge_group` scores the group's
answers in one call to the run's `LLMJudge` (`rl_core.pipeline.judging` applies the
scores to the trajectories), its failures counted as the other verifiers' are.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from rl_core.envs.base import Action, Environment, Reset, Step
from rl_core.envs.judge import JudgeFailed, JudgeItem, LLMJudge
from rl_core.envs.sandbox import SandboxLimits, run_python
from rl_core.errors import EnvironmentFailure
from rl_core.rewards import (
    MissingReference,
    ProgramRun,
    RewardContext,
    RewardTerm,
    VerifierFailed,
    group_terms,
    score_async,
)

# python_tests: a test program gets what code_exec's default gives the model's own runs,
# well inside the verifier's own time limit (Scored's timeout_s).
TEST_LIMITS = SandboxLimits(wall_s=5.0, cpu_s=5, memory_bytes=256 * 2**20)


async def run_tests(program: str) -> ProgramRun:
    run = await run_python(program, TEST_LIMITS)
    return ProgramRun(
        exit_code=run.exit_code, stdout=run.stdout, stderr=run.stderr, killed_by=run.killed_by
    )


class Scorer(Protocol):
    """Scores an episode elsewhere (`rl_core.envs.scorer.WebhookScorer`)."""

    async def __call__(self, ctx: RewardContext) -> float: ...

    async def aclose(self) -> None: ...

    def step_metrics(self) -> dict[str, float]: ...


@dataclasses.dataclass
class _Episode:
    reference: Any
    prompt: tuple[dict[str, Any], ...] = ()
    contents: list[str] = dataclasses.field(default_factory=list)
    env_reward: float = 0.0
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    results: dict[int, Step] = dataclasses.field(default_factory=dict)


class Scored:
    """Wraps ``inner``; steps give 0 until the end, then the weighted terms' sum."""

    def __init__(
        self,
        inner: Environment,
        terms: tuple[RewardTerm, ...],
        *,
        timeout_s: float = 30.0,
        scorer: Scorer | None = None,
        judge: LLMJudge | None = None,
    ) -> None:
        self.inner = inner
        self.terms = terms
        self.timeout_s = timeout_s
        self.scorer = scorer  # the ``webhook`` verifier's endpoint, when the run names one
        self.judge_weight = sum(t.weight for t in group_terms(terms))
        if group_terms(terms) and judge is None:
            raise ValueError("reward 'judge' needs the run's judge (environment.judge)")
        self.judge = judge if group_terms(terms) else None
        self._episodes: dict[str, _Episode] = {}
        # Ended episodes' answers awaiting their group's judge call, by episode id.
        self._awaiting: dict[str, JudgeItem] = {}
        self.verifier_failures: collections.Counter[tuple[str, str]] = collections.Counter()
        self._reported: collections.Counter[tuple[str, str]] = collections.Counter()

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        reset = await self.inner.reset(episode_id, seed, config)
        self._episodes[episode_id] = _Episode(
            reference=reset.info.get("answer"),
            prompt=tuple(dict(m) for m in reset.messages),
            info=dict(reset.info),
        )
        return reset

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise EnvironmentFailure(f"no episode {episode_id!r}; call reset first")
        if step in episode.results:  # a retry must not count the action twice
            return episode.results[step]
        result = await self.inner.step(episode_id, step, action)
        episode.contents.append(action.content)
        episode.env_reward += float(result.reward)
        episode.info.update(result.info)
        reward = 0.0
        info = dict(result.info)
        if result.done:
            ctx = RewardContext(
                contents=tuple(episode.contents),
                reference=episode.reference,
                env_reward=episode.env_reward,
                turns=len(episode.contents),
                info=episode.info,
                sandbox=run_tests,
                scorer=self.scorer,
                episode_id=episode_id,
                prompt=episode.prompt,
            )
            try:
                terms = await score_async(self.terms, ctx, timeout_s=self.timeout_s)
            except MissingReference as exc:
                raise EnvironmentFailure(str(exc)) from exc
            except VerifierFailed as exc:
                self.verifier_failures[exc.name, exc.reason] += 1
                raise EnvironmentFailure(str(exc)) from exc
            reward = sum(terms.values())
            info |= {"reward_terms": terms, "env_reward": episode.env_reward}
            if self.judge is not None:
                self._awaiting[episode_id] = JudgeItem(
                    prompt=episode.prompt, answer=ctx.final, reference=episode.reference
                )
        scored = Step(messages=result.messages, reward=reward, done=result.done, info=info)
        episode.results[step] = scored
        return scored

    async def close(self, episode_id: str) -> None:
        self._episodes.pop(episode_id, None)
        await self.inner.close(episode_id)

    async def aclose(self) -> None:
        """Release what the inner environment holds (a webhook's HTTP client)."""
        aclose = getattr(self.inner, "aclose", None)
        if aclose is not None:
            await aclose()
        if self.scorer is not None:
            await self.scorer.aclose()
        if self.judge is not None:
            await self.judge.aclose()

    async def judge_group(self, episode_ids: Sequence[str]) -> dict[str, float | JudgeFailed]:
        """The judge term's weighted value for each of a group's episodes that ended with
        an answer (the others are not in the result), or why it has none; one call."""
        if self.judge is None:
            return {}
        waiting = [(e, self._awaiting.pop(e)) for e in episode_ids if e in self._awaiting]
        results = await self.judge.score([item for _, item in waiting])
        out: dict[str, float | JudgeFailed] = {}
        for (episode_id, _), result in zip(waiting, results, strict=True):
            if isinstance(result, JudgeFailed):
                self.verifier_failures["judge", result.reason] += 1
                out[episode_id] = result
            else:
                out[episode_id] = self.judge_weight * result
        return out

    def forget(self, episode_ids: Sequence[str]) -> None:
        """Drop answers that will not be judged (their group was cancelled)."""
        for episode_id in episode_ids:
            self._awaiting.pop(episode_id, None)

    def step_metrics(self) -> dict[str, float]:
        """The inner environment's ``env/`` metrics, if it keeps any (a webhook's faults),
        and the verifier failures since the last call, by name and reason."""
        step_metrics = getattr(self.inner, "step_metrics", None)
        metrics = step_metrics() if step_metrics is not None else {}
        if self.scorer is not None:
            metrics |= self.scorer.step_metrics()
        if self.judge is not None:
            metrics |= self.judge.step_metrics()
        for (name, reason), n in self.verifier_failures.items():
            since = n - self._reported[name, reason]
            metrics[f"env/verifier_failed/{name}/{reason}"] = float(since)
        self._reported = collections.Counter(self.verifier_failures)
        return metrics
