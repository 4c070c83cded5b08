"""Reward functions attached to a run by name (``environment.reward`` in the spec).

``environment.reward: "numeric_match+length_penalty:0.002"`` replaces the
environment's own reward: when the environment ends an episode, the terms are
computed from the whole episode and summed, each times its weight (the number
after ``:``, else the function's default weight). Before the end every step's
reward is 0, so the return of the episode is exactly the sum of the terms.

A function sees a `RewardContext`. The reference answer is what the
environment put under ``"answer"`` in its reset ``info`` (the built-ins and
any webhook environment can do so); a function that needs it fails the
episode with a message saying so when it is missing.

An episode that the agent cuts short (turn or token limits) gets no terms:
the environment never judged it, so there is nothing to compare.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclasses.dataclass(frozen=True)
class RewardContext:
    contents: tuple[str, ...]  # the assistant's message text, one per step
    reference: Any  # reset info["answer"], or None
    env_reward: float  # what the environment itself gave, summed over the episode
    turns: int
    info: dict[str, Any]  # reset and step infos, merged

    @property
    def final(self) -> str:
        return self.contents[-1] if self.contents else ""


class MissingReference(ValueError):
    """The reward needs a reference answer the environment did not give."""


RewardFn = Callable[[RewardContext], float]


@dataclasses.dataclass(frozen=True)
class RewardFunction:
    fn: RewardFn
    default_weight: float
    doc: str


REWARDS: dict[str, RewardFunction] = {}


def register_reward(name: str, fn: RewardFn, *, default_weight: float = 1.0, doc: str = "") -> None:
    """Make ``fn`` attachable by ``name``; names are lower-case identifiers."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"reward name {name!r} must be a lower-case identifier")
    REWARDS[name] = RewardFunction(fn=fn, default_weight=default_weight, doc=doc)


@dataclasses.dataclass(frozen=True)
class RewardTerm:
    name: str
    weight: float


def parse_reward(text: str) -> tuple[RewardTerm, ...]:
    """``"a+b:0.5"`` -> terms; ValueError naming the part that is wrong."""
    terms = []
    for part in text.split("+"):
        name, sep, weight_text = part.strip().partition(":")
        if name not in REWARDS:
            raise ValueError(
                f"unknown reward function {name!r}; known: {', '.join(sorted(REWARDS))}"
            )
        weight = REWARDS[name].default_weight
        if sep:
            try:
                weight = float(weight_text)
            except ValueError:
                raise ValueError(f"reward {part.strip()!r}: weight must be a number") from None
            if not math.isfinite(weight):
                raise ValueError(f"reward {part.strip()!r}: weight must be finite")
        terms.append(RewardTerm(name=name, weight=weight))
    return tuple(terms)


def score(terms: tuple[RewardTerm, ...], ctx: RewardContext) -> dict[str, float]:
    """Each term's weighted value, by name (a name used twice is summed)."""
    values: dict[str, float] = {}
    for term in terms:
        value = term.weight * float(REWARDS[term.name].fn(ctx))
        values[term.name] = values.get(term.name, 0.0) + value
    return values


def normalize(text: str) -> str:
    """Case, surrounding space and punctuation, and inner runs of space do not matter."""
    return " ".join(str(text).casefold().split()).strip(" .!\"'`")


def last_number(text: str) -> float | None:
    found = _NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


def _reference(ctx: RewardContext, name: str) -> Any:
    if ctx.reference is None:
        raise MissingReference(
            f"reward {name!r} compares with a reference answer, but the environment's reset "
            "info has no 'answer'; put one there or attach a reward that needs none"
        )
    return ctx.reference


def exact_match(ctx: RewardContext) -> float:
    return float(normalize(ctx.final) == normalize(_reference(ctx, "exact_match")))


def numeric_match(ctx: RewardContext) -> float:
    want = float(_reference(ctx, "numeric_match"))
    got = last_number(ctx.final)
    return float(got is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-6))


def contains(ctx: RewardContext) -> float:
    return float(normalize(_reference(ctx, "contains")) in normalize(ctx.final))


register_reward("env", lambda ctx: ctx.env_reward, doc="the environment's own reward")
register_reward("exact_match", exact_match, doc="1 if the final message equals the answer")
register_reward("numeric_match", numeric_match, doc="1 if its last number equals the answer")
register_reward("contains", contains, doc="1 if the final message contains the answer")
register_reward(
    "length_penalty",
    lambda ctx: -float(sum(len(c) for c in ctx.contents)),
    default_weight=0.001,
    doc="minus the characters the assistant wrote (default 0.001 per character)",
)
register_reward(
    "turn_penalty",
    lambda ctx: -float(max(0, ctx.turns - 1)),
    default_weight=0.1,
    doc="minus the turns after the first (default 0.1 per turn)",
)
