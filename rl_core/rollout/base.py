"""The rollout-engine seam: what the agent asks of whatever produces tokens.

Pure Python (no JAX at import), so fakes and remote engines need none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from rl_core.errors import RolloutError


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """temperature 0 is greedy; top_k 0 and top_p 1 switch those filters off.

    The penalties are OpenAI's: before the filters, each token's logit is lowered by
    ``frequency_penalty`` times the number of times it was sampled so far in this
    completion, plus ``presence_penalty`` if it was sampled at all (0: off).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0


@dataclasses.dataclass(frozen=True)
class Grammar:
    """What a completion's text must spell, applied as a token mask while sampling.

    ``lark`` is a grammar in llguidance's Lark dialect (``%json {schema}`` embeds a JSON
    schema; ``start`` is the start rule). The mask is part of the behaviour policy: a
    completion's ``logprobs`` are under the masked distribution it was drawn from.
    """

    lark: str


class GrammarError(RolloutError):
    """A grammar the engine cannot compile: the client's to fix (a 400), not a server fault.

    The message is the grammar library's reason (llguidance's, in both engines).
    """


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sampled continuation.

    ``logprobs[i]`` is the log-probability of ``tokens[i]`` under the
    distribution it was drawn from (after temperature, top-k and top-p); 0 for
    greedy decoding, whose distribution is a point mass. A stop token, when the
    sequence ended on one, is the last of ``tokens``.
    """

    tokens: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    policy_version: int
    # With ``generate(top_logprobs=k)``, k > 0: for each of ``tokens``, the k most likely
    # (token id, logprob) pairs of the distribution it was drawn from, most likely first.
    # Fewer where fewer than k tokens could be drawn (cut by top-k/top-p or a grammar: a
    # forced token has itself alone). A greedy token's are those of its penalised, masked
    # distribution at temperature 1 (its own is a point mass), so the first is the token.
    top_logprobs: list[list[tuple[int, float]]] | None = None


def token_limits(
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int | Sequence[int],
    seeds: Sequence[int],
) -> list[int]:
    """Each prompt's ``max_new_tokens``, after the checks every engine's ``generate`` makes."""
    limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else max_new_tokens
    if not len(prompts) == len(limits) == len(seeds):
        raise RolloutError("prompts, max_new_tokens and seeds must have the same length")
    if any(m < 1 for m in limits):
        raise RolloutError("max_new_tokens must be at least 1")
    if any(not p for p in prompts):
        raise RolloutError("cannot continue an empty prompt")
    return list(limits)


def refuse_unserved(
    engine: str,
    sampling: SamplingParams,
    grammars: Sequence[Grammar | None] | None,
    top_logprobs: int,
) -> None:
    """Raise `RolloutError` naming what of a request this engine does not serve yet."""
    asked = []
    if grammars is not None and any(g is not None for g in grammars):
        asked.append("grammars")
    if top_logprobs:
        asked.append("top_logprobs")
    if sampling.frequency_penalty or sampling.presence_penalty:
        asked.append("penalties")
    if asked:
        raise RolloutError(f"the {engine} engine does not serve {', '.join(asked)}")


@runtime_checkable
class RolloutEngine(Protocol):
    @property
    def policy_version(self) -> int: ...

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
        """Continue each prompt; requests from concurrent callers may share a device call.

        ``grammars`` (one per prompt, None for free text) constrains what each may sample;
        ``top_logprobs`` asks for that many alternatives per token (`Completion`). An
        engine that cannot serve either raises `RolloutError` saying so.
        """
        ...

    def update_weights(self, params: Any, version: int) -> None:
        """Swap in a new policy; calls already running finish with the old one."""
        ...
