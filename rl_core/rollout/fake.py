"""A scripted `RolloutEngine` for tests: replies with given token ids, no model, no JAX."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from rl_core.rollout.base import Completion, Grammar, SamplingParams


class ScriptedEngine:
    """Answers the n-th call with ``replies[n]`` (cut at ``max_new_tokens``).

    A reply ends with "stop" if its last token is in ``stop_ids``. Each token's
    logprob is ``-0.1 * (its index in the call log + 1)``, distinct so tests can
    check where every logprob lands. ``delay_s`` makes each call slow. Each call's
    sampling, grammars and ``top_logprobs`` are kept in ``calls``; with ``top_logprobs=k``
    each token's alternatives are itself then ids 0.. (logprobs -0.1 * n - 1 - j).
    """

    def __init__(
        self,
        replies: Sequence[Sequence[int]],
        *,
        stop_ids: Sequence[int],
        delay_s: float = 0.0,
    ) -> None:
        self._replies = [list(r) for r in replies]
        self._stop = set(stop_ids)
        self._delay_s = delay_s
        self.prompts: list[list[int]] = []
        self.calls: list[dict[str, Any]] = []
        self.version = 0
        self.params: Any = None

    @property
    def policy_version(self) -> int:
        return self.version

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int],
        grammars: Sequence[Grammar | None] | None = None,
        top_logprobs: int = 0,
    ) -> list[Completion]:
        self.calls.append(
            {"sampling": sampling, "grammars": grammars, "top_logprobs": top_logprobs}
        )
        if self._delay_s:
            await asyncio.sleep(self._delay_s)
        limits = (
            [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else max_new_tokens
        )
        out = []
        for prompt, limit in zip(prompts, limits, strict=True):
            n = len(self.prompts)
            self.prompts.append(list(prompt))
            tokens = self._replies[n % len(self._replies)][:limit]
            logprob = -0.1 * (n + 1)
            top = None
            if top_logprobs:
                top = [_alternatives(t, logprob, top_logprobs) for t in tokens]
            out.append(
                Completion(
                    tokens=tokens,
                    logprobs=[logprob] * len(tokens),
                    finish_reason="stop" if tokens and tokens[-1] in self._stop else "length",
                    policy_version=self.version,
                    top_logprobs=top,
                )
            )
        return out

    def update_weights(self, params: Any, version: int) -> None:
        self.params, self.version = params, version


def _alternatives(token: int, logprob: float, k: int) -> list[tuple[int, float]]:
    """The sampled token first, then ids 0, 1, ... (itself left out), each 1 less likely."""
    others = [o for o in range(k + 1) if o != token][: k - 1]
    return [(token, logprob), *((o, logprob - 1 - j) for j, o in enumerate(others))]
